"""Job types: what `@app.job` registers, and every check made on a type or on a new job of it.

A declaration is checked when the app module is imported (a bad one fails there, not in a
worker); a new job is checked against its type before anything is written (bad input stores
nothing). Never opens a connection: the App hands in what it read.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
import time
import unicodedata
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, TypeVar

import msgspec

from hivejobs.broker import MAX_ID_LENGTH
from hivejobs.broker.fair import FairBy
from hivejobs.debounce import Debounce
from hivejobs.errors import (
    InvalidArgument,
    JobDuplicate,
    JobIdConflict,
    PayloadInvalid,
)
from hivejobs.records.jobs import (
    JOB_TYPE_NAME_RE,
    PRIORITIES,
    Delivery,
    Inserted,
    JobTypeInfo,
    NewJob,
    UniqueClaim,
)
from hivejobs.sequence import SequenceBy, declared_sequence
from hivejobs.serialization import PayloadCodec, decode_json, payload_type_of

if TYPE_CHECKING:
    from hivejobs.flow import Limits

NAME_RE = JOB_TYPE_NAME_RE
# Unicode categories refused in ids: controls, format characters (RTL override, zero-width),
# line and paragraph separators, and lone surrogates (undecodable bytes; not storable).
_BAD_ID_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})
MAX_DELAY_S = 366 * 24 * 3600.0
# How far in the past a run_at may lie: a little clock skew or a late retry of an enqueue is
# "run now"; a date years back is a mistake (it would show as years of pickup latency).
MAX_RUN_AT_PAST_S = 24 * 3600.0
Handler = Callable[..., object]
# A failed or cancelled job can be enqueued again at once, as Oban does by default.
UNIQUE_STATES = ("scheduled", "queued", "running", "succeeded")
_canonical = msgspec.json.Encoder(order="deterministic")  # key order does not make a new key
F = TypeVar("F", bound=Handler)


class Retry(Exception):
    """Raise in a handler to retry the job after `delay` seconds (counts as an attempt).
    Control flow, not an error: named for what the handler asks."""

    def __init__(self, delay: float | None = None, reason: str | None = None) -> None:
        super().__init__(reason or "retry requested")
        if delay is not None:
            check_delay(delay)
        self.delay = delay


class Fail(Exception):
    """Raise in a handler to end the job `failed` now, attempts left or not (rickover's
    `retryable: false`): for errors that another attempt cannot fix. The message is kept
    as the job's error."""

    def __init__(self, reason: str = "failed by the handler") -> None:
        super().__init__(reason)


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with +-20 % jitter: base * 2**(attempt-1), capped at max_s."""

    base_s: float = 1.0
    max_s: float = 600.0

    def delay_s(self, attempt: int) -> float:
        raw = min(self.max_s, self.base_s * 2 ** min(attempt - 1, 60))
        return float(raw * random.uniform(0.8, 1.2))


@dataclass(frozen=True)
class Unique:
    """A job type's unique window: while it lasts (from enqueue), a job whose key matches a
    job in one of `states` is not stored again; the existing job's id is returned, or
    JobDuplicate raised. The key is the type and the payload (or the `by` fields of it)."""

    window_s: float
    by: tuple[str, ...] | None
    states: tuple[str, ...]
    on_duplicate: str  # "return" | "raise"

    def claim(self, name: str, payload: bytes) -> UniqueClaim:
        value = decode_json(payload)
        if self.by is not None:
            if not isinstance(value, dict):
                raise PayloadInvalid(name, "unique_by needs a JSON object payload")
            value = {field: value.get(field) for field in self.by}
        digest = hashlib.sha256(_canonical.encode(value)).hexdigest()
        return UniqueClaim(key=f"{name}:{digest}", window_s=self.window_s, states=self.states)


@dataclass(frozen=True, kw_only=True)
class JobTypeSpec:
    """A job type as any process can know it: its options and its payload codec, no handler.

    What a registered type and a type a worker fleet declared in Postgres (`declared_type`,
    for the CLI) share. Owns the rules a new job of this type must follow (`new_job`,
    `new_jobs`) and what an insert's answer means for the caller (`outcome`). Frozen: built
    once, complete, from checked options."""

    name: str
    concurrency: int
    processes: int
    attempts: int
    delivery: Delivery
    timeout_s: float | None
    priority: int
    codec: PayloadCodec = field(repr=False)
    backoff: Backoff = Backoff()
    # rickover's status callbacks: the handler hands the work to another service and returns;
    # the job stays running until that service posts the outcome (or the timeout passes).
    callback: bool = False
    callback_timeout_s: float | None = None
    unique: Unique | None = None
    debounce: Debounce | None = None  # debounce.py: its enqueues go into one waiting job
    retention_s: float | None = None  # archive retention of its finished jobs (None: global)
    limits: Limits | None = None  # fleet-wide limits (flow.py)
    max_rss_mb: float | None = None  # recycle its pool processes above this (worker/memory.py)
    # A pool process shared with other types (worker/placement.py); None: its own.
    pool: str | None = None
    fair: FairBy | None = None  # fair dispatch across the keys of a payload field (broker/fair.py)
    sequence: SequenceBy | None = None  # sequence_by: one job per key at a time (sequence.py)

    def info(self) -> JobTypeInfo:
        return JobTypeInfo(
            name=self.name,
            concurrency=self.concurrency,
            processes=self.processes,
            attempts=self.attempts,
            delivery=self.delivery,
            timeout_s=self.timeout_s,
            callback=self.callback,
            callback_timeout_s=self.callback_timeout_s,
            fair_by=None if self.fair is None else self.fair.field,
            sequence_by=None if self.sequence is None else self.sequence.field,
            on_failure=None if self.sequence is None else self.sequence.on_failure,
        )

    def encode(self, payload: object) -> bytes:
        """The payload as stored; a limit_by type's must be a JSON object holding the field
        (flow.py), else its jobs would share one partition no one asked for."""
        encoded = self.codec.encode(payload)
        field = None if self.limits is None else self.limits.limit_by
        if field is not None:
            value = decode_json(encoded)
            if not isinstance(value, dict):
                raise PayloadInvalid(self.name, f"limit_by={field!r} needs a JSON object payload")
            if field not in value:
                raise PayloadInvalid(self.name, f"the payload has no {field!r} field (limit_by)")
        if self.fair is not None:
            self.fair.check_payload(self.name, decode_json(encoded))
        return encoded

    def new_job(
        self,
        payload: object,
        job_id: str | None,
        priority: int | None,
        delay: float | None,
        run_at: datetime | None,
        expires_at: datetime | None,
    ) -> NewJob:
        """Check the options and encode the payload: bad input raises before any write."""
        prio = self._checked_options(job_id, priority, delay, run_at, expires_at)
        encoded = self.encode(payload)
        seq = self.sequence
        return NewJob(
            id=job_id or str(uuid.uuid4()),
            name=self.name,
            priority=prio,
            attempts=self.attempts,
            delivery=self.delivery,
            payload=encoded,
            delay_s=delay,
            run_at=run_at,
            expires_at=expires_at,
            unique=None if self.unique is None else self.unique.claim(self.name, encoded),
            debounce=None
            if self.debounce is None
            else self.debounce.claim(self.name, encoded, self.codec),
            seq_key=None if seq is None else seq.key(self.name, encoded),
            seq_hold=seq is not None and seq.on_failure == "hold",
        )

    def new_jobs(
        self,
        payloads: Iterable[object],
        priority: int | None,
        delay: float | None,
        expires_at: datetime | None,
    ) -> list[NewJob]:
        """Every payload checked first: one bad one stores nothing."""
        if self.unique is not None or self.debounce is not None:
            raise InvalidArgument(
                f"job type {self.name!r} is unique: enqueue its jobs one by one (enqueue_many "
                "stores with COPY, which cannot take unique keys)"
            )
        batch = list(payloads)
        if not batch:
            return []
        prio = self._checked_options(None, priority, delay, None, expires_at)  # once for all
        return [self.new_job(p, None, prio, delay, None, expires_at) for p in batch]

    def outcome(self, job: NewJob, inserted: Inserted) -> tuple[str, bool]:
        """The id `enqueue` returns, and whether this call stored a queued job to dispatch now.

        An existing id with the same type and payload is an idempotent retry; with another, a
        conflict (unless the job finished and was pruned meanwhile). A duplicate in a unique
        window returns the key's job, or raises. A debounced or coalesced enqueue returns the
        key's job, dispatched now only if this enqueue made it queued (store/debounce.py)."""
        if self.debounce is not None:
            return inserted.id, inserted.created and inserted.state == "queued"
        if inserted.state == "duplicate":
            if self.unique is not None and self.unique.on_duplicate == "raise":
                raise JobDuplicate(self.name, inserted.id)
            return inserted.id, False
        if not inserted.created:
            if inserted.name != job.name or inserted.payload != job.payload:
                if inserted.state != "gone":
                    raise JobIdConflict(job.id)
            return job.id, False
        return job.id, inserted.state == "queued"

    def _checked_options(
        self,
        job_id: str | None,
        priority: int | None,
        delay: float | None,
        run_at: datetime | None,
        expires_at: datetime | None,
    ) -> int:
        """Refuse bad enqueue options before anything is written; returns the priority."""
        if self.debounce is not None:
            _check_debounced_options(self.name, job_id, delay, run_at)
        if job_id is not None:
            check_id(job_id)
        prio = self.priority if priority is None else priority
        check_priority(prio)
        if delay is not None and run_at is not None:
            raise InvalidArgument("give either delay or run_at, not both")
        if delay is not None:
            check_delay(delay)
        for label, moment in (("run_at", run_at), ("expires_at", expires_at)):
            if moment is not None and not isinstance(moment, datetime):
                raise InvalidArgument(f"{label} must be a datetime, not {type(moment).__name__}")
            if moment is not None and moment.tzinfo is None:
                raise InvalidArgument(f"{label} must be timezone-aware (e.g. datetime.now(UTC))")
        if run_at is not None:
            check_run_at(run_at)
        if expires_at is not None and expires_at.timestamp() <= time.time():
            raise InvalidArgument("expires_at is already in the past")
        return prio


@dataclass(frozen=True, kw_only=True)
class JobType(JobTypeSpec):
    """A registered job type: a JobTypeSpec and the handler `@app.job` decorated, built once at
    import time (`with_handler`), so a worker never meets a type it cannot run."""

    handler: Handler

    @classmethod
    def with_handler(
        cls, spec: JobTypeSpec, handler: Handler, backoff: Backoff, max_payload_bytes: int
    ) -> JobType:
        """The type `spec` declared, running `handler`, its payloads decoded to the type the
        handler's annotation names."""
        fields = {f.name: getattr(spec, f.name) for f in dataclasses.fields(JobTypeSpec)}
        fields["codec"] = PayloadCodec(spec.name, payload_type_of(handler), max_payload_bytes)
        fields["backoff"] = backoff
        return cls(**fields, handler=handler)


def _check_debounced_options(
    name: str, job_id: str | None, delay: float | None, run_at: datetime | None
) -> None:
    """A debounced or coalesced job's id and run time belong to its key's window."""
    for option, value in (("id", job_id), ("delay", delay), ("run_at", run_at)):
        if value is not None:
            raise InvalidArgument(
                f"{option}: job type {name!r} is debounced/coalesced, so the key's window "
                "chooses the job's id and run time; enqueue without it"
            )


def declared_type(info: JobTypeInfo, codec: PayloadCodec) -> JobTypeSpec:
    """A type that a running worker fleet declared in Postgres (for the CLI, which has no
    handler): its options as declared, payloads checked by `codec` (the schema its worker
    declared), default backoff."""
    return JobTypeSpec(
        name=info.name,
        concurrency=info.concurrency,
        processes=info.processes,
        attempts=info.attempts,
        delivery=info.delivery,
        timeout_s=info.timeout_s,
        priority=0,
        codec=codec,
        callback=info.callback,
        callback_timeout_s=info.callback_timeout_s,
        fair=None if info.fair_by is None else FairBy(info.fair_by),
        sequence=declared_sequence(info.sequence_by, info.on_failure),
    )


def check_delay(delay: float) -> None:
    if isinstance(delay, bool) or not isinstance(delay, int | float):
        raise InvalidArgument(f"delay must be a number of seconds, not {type(delay).__name__}")
    if not (0 <= delay <= MAX_DELAY_S):  # also refuses NaN
        raise InvalidArgument(f"delay must be between 0 and {MAX_DELAY_S:.0f} seconds, not {delay}")


def check_run_at(run_at: datetime) -> None:
    """The same horizon as `delay` ahead, and at most a day behind now."""
    ahead = run_at.timestamp() - time.time()
    if not (-MAX_RUN_AT_PAST_S <= ahead <= MAX_DELAY_S):
        raise InvalidArgument(
            f"run_at must be between 1 day before now and 366 days after, not {run_at.isoformat()}"
        )


def check_priority(priority: int) -> None:
    if isinstance(priority, bool) or not isinstance(priority, int) or priority not in PRIORITIES:
        raise InvalidArgument(f"priority must be an integer 0-9 (0 runs first), not {priority!r}")


def check_id(job_id: object) -> None:
    """For enqueue and every lookup: a job id Postgres can store and a terminal can show."""
    if not isinstance(job_id, str) or not 1 <= len(job_id) <= MAX_ID_LENGTH:
        raise InvalidArgument(
            f"job id must be a string of 1-{MAX_ID_LENGTH} characters, not {job_id!r:.80}"
        )
    if any(unicodedata.category(ch) in _BAD_ID_CATEGORIES for ch in job_id):
        raise InvalidArgument(
            f"job id {job_id!r} contains control characters (or invisible format or "
            "separator characters, or bytes that are not UTF-8)"
        )
