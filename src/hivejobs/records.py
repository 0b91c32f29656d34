"""msgspec Structs that every layer shares: what a job is, as read from or written to Postgres.
A chain's records are chain_records.py's.

A record the HTTP API also returns is defined once, as a generic `...Fields` class over the
types of its states: the record fills in the Literal, the API's response class (web/schemas.py)
plain `str`, so that its OpenAPI schema has no enums for states.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, Literal, NamedTuple, TypeVar, get_args

import msgspec

# The chain records (chain_records.py), re-exported for the modules that still import them
# from here (client/, web/, store/dashboard.py); new code imports hivejobs.chain_records.
from hivejobs.chain_records import ChainJobFields as ChainJobFields
from hivejobs.chain_records import ChainJobState as ChainJobState
from hivejobs.chain_records import ChainJobStatus as ChainJobStatus
from hivejobs.chain_records import ChainQuery as ChainQuery
from hivejobs.chain_records import ChainState as ChainState
from hivejobs.chain_records import ChainStatus as ChainStatus
from hivejobs.chain_records import ChainStatusFields as ChainStatusFields
from hivejobs.chain_records import ChainSummary as ChainSummary
from hivejobs.chain_records import ChainSummaryFields as ChainSummaryFields
from hivejobs.chain_records import JobLogEntry as JobLogEntry
from hivejobs.chain_records import JobLogFields as JobLogFields
from hivejobs.chain_records import JobLogState as JobLogState
from hivejobs.chain_records import RunningTry as RunningTry

JobState = Literal["scheduled", "queued", "running", "succeeded", "failed", "cancelled", "expired"]
# The states of a finished job: the archive holds these alone.
TerminalState = Literal["succeeded", "failed", "cancelled", "expired"]
TERMINAL_STATES: frozenset[str] = frozenset(get_args(TerminalState))
Delivery = Literal["at_least_once", "at_most_once"]
# How a claim ended, as the pool reports it to the completer.
# "await_callback": a callback type's handler returned; the job stays running, without a
# worker, until the other service posts its outcome (or the callback timeout passes).
Outcome = Literal["succeeded", "failed", "retry", "cancelled", "suspend", "await_callback"]

PRIORITIES = range(10)  # 0 runs first; the default.
# A job type's name; fullmatch, never `$` (which also matches before a trailing newline).
JOB_TYPE_NAME_RE = re.compile(r"[A-Za-z0-9_.\-]{1,64}")

# The types that the records and the API's responses fill in differently (see the docstring).
StateT = TypeVar("StateT")
DeliveryT = TypeVar("DeliveryT")


class JobTypeInfo(msgspec.Struct, frozen=True, kw_only=True):
    """A registered job type as the worker fleet declares it in Postgres."""

    name: str
    concurrency: int
    processes: int
    attempts: int
    delivery: Delivery
    timeout_s: float | None
    callback: bool = False  # stays running after its handler until a status callback
    callback_timeout_s: float | None = None
    fair_by: str | None = None  # fair dispatch across this payload field's values
    # sequence_by and on_failure (sequence.py): a client enqueuing by name numbers its jobs too.
    sequence_by: str | None = None
    on_failure: str | None = None


class NewJob(msgspec.Struct, frozen=True, kw_only=True):
    """A validated job ready to insert: the payload is already encoded JSON."""

    id: str
    name: str
    priority: int
    attempts: int
    delivery: Delivery
    payload: bytes
    delay_s: float | None
    run_at: datetime | None
    expires_at: datetime | None
    unique: UniqueClaim | None = None
    trace_context: str | None = None  # the enqueue span's W3C traceparent (tracing.py)
    debounce: DebounceClaim | None = None
    # sequence_by (sequence.py): the key (the field's JSON text) and on_failure="hold".
    seq_key: str | None = None
    seq_hold: bool = False


@dataclass(frozen=True)
class DebounceClaim:
    """A debounce or coalesce key to go into (hivejobs/debounce.py says what each mode does).

    A dataclass, not a Struct: it carries the type's merge function, never sent anywhere.
    `merge(stored, new)` returns the encoded payload the job keeps (coalesce only)."""

    key: str
    mode: Literal["debounce", "coalesce"]
    within_s: float
    max_wait_s: float | None
    merge: Callable[[bytes, bytes], bytes] | None = None


class UniqueClaim(msgspec.Struct, frozen=True, kw_only=True):
    """A unique window to take before inserting: one job per key while it lasts and the
    key's job is in one of `states`."""

    key: str
    window_s: float
    states: tuple[str, ...]


class Inserted(msgspec.Struct, frozen=True):
    """What an insert returned: id, state, and whether this call created it."""

    id: str
    name: str
    state: str
    priority: int
    payload: bytes
    created: bool


class ClaimedJob(msgspec.Struct, kw_only=True):
    id: str
    name: str
    attempt: int
    attempts: int
    delivery: Delivery
    payload: bytes
    claim_token: int
    priority: int
    lost: int = 0  # times a process died running it: > 0 runs it alone (quarantine)
    pickup_s: float = 0.0  # from its due time (run_at) to this claim: the pickup latency
    trace_context: str | None = None  # the enqueue span's W3C traceparent (tracing.py)


class Completion(msgspec.Struct, frozen=True, kw_only=True):
    """One finished claim, written by the completer in a group-commit batch."""

    id: str
    claim_token: int
    outcome: Outcome
    error: str | None = None
    result: bytes | None = None
    retry_delay_s: float = 0.0
    callback_timeout_s: float = 0.0  # await_callback: how long the other service has


# -- rows the store hands back ----------------------------------------------------------
# Tuples by design (NamedTuple): each is read straight off a result row (psycopg class_row),
# and a Push is what Broker.push_many takes, so a row goes to Redis without being copied.


class Push(NamedTuple):
    """A queued job's id for the broker: its Redis list is (name, priority)."""

    id: str
    name: str
    priority: int


class Requeued(NamedTuple):
    """A job Store.finish left waiting, `state` 'queued' (push its id) or 'scheduled': a
    claim put back (retry, suspension), or the next job of a sequence key the batch ended."""

    id: str
    name: str
    priority: int
    state: str


class HeldClaim(NamedTuple):
    """A running job of one process, with the claim token that fences its writes."""

    id: str
    claim_token: int


class JobRef(NamedTuple):
    """A live job's id and type (foreign ids in a pool's list, a shutdown's running jobs)."""

    id: str
    name: str


class QueuedEntry(NamedTuple):
    """One row of a queue's keyset page: the last one's (queued_at, id) starts the next."""

    id: str
    name: str
    priority: int
    queued_at: datetime


class KeyedQueued(NamedTuple):
    """A fair type's queued row, its key (fair_by's value) and whether the grace is past."""

    id: str
    queued_at: datetime
    key: str
    past_grace: bool


class OldestQueued(NamedTuple):
    """A queue's oldest queued row: when, and whether that is longer ago than the grace."""

    name: str
    priority: int
    queued_at: datetime
    past_grace: bool


class Lease(NamedTuple):
    """The coordinator lease as held: every guarded write checks holder and term."""

    holder: str
    term: int


class LeaseInfo(msgspec.Struct, frozen=True, kw_only=True):
    """The lease row as /metrics shows it: `valid` is false once it expired."""

    holder: str | None
    term: int
    valid: bool


class Rescued(msgspec.Struct, frozen=True, kw_only=True):
    """What one rescue of dead processes' claims did."""

    requeued: list[Push]  # to push to Redis
    failed: int
    # Claims whose id was already archived: the archived record won, the live row is gone.
    archived_duplicates: list[str]


class JobFields(msgspec.Struct, Generic[StateT, DeliveryT], frozen=True, kw_only=True):
    """A job with its payload and result (JobInfo; the API's JobOut)."""

    id: str
    name: str
    state: StateT
    attempt: int
    attempts: int
    priority: int
    delivery: DeliveryT
    payload: object
    created_at: datetime
    run_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    expires_at: datetime | None
    error: str | None
    result: object


class JobInfo(JobFields[JobState, Delivery], frozen=True, kw_only=True):
    """A job, live or archived, as App.get_job returns it."""


class TypeCounts(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    concurrency: int
    processes: int
    queued: int
    scheduled: int
    running: int
    failed_last_hour: int
    succeeded_last_hour: int
    paused_at: datetime | None = None  # paused fleet-wide since; None: not paused


class TypeFlow(msgspec.Struct, frozen=True, kw_only=True):
    """A job type's flow state as operators steer it: paused fleet-wide since
    `paused_at`, and its runner threads per pool process: `scaled_concurrency` when
    `hivejobs scale` set one, else the code's `concurrency`."""

    name: str
    paused: bool
    paused_at: datetime | None
    concurrency: int
    scaled_concurrency: int | None


class WorkerInfo(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    host: str
    pid: int
    role: str
    pool: str | None
    started_at: datetime
    heartbeat_at: datetime
    heartbeat_age_s: float
    running: int


class JobSummaryFields(msgspec.Struct, Generic[StateT], frozen=True, kw_only=True):
    """One job of a listing, live or archived, without payload or result (JobSummary; the
    API's JobListItem). `error_line`: the exception line of the error (`ValueError: ...`,
    display.exception_line), None when the job has no error."""

    id: str
    name: str
    state: StateT
    attempt: int
    attempts: int
    priority: int
    created_at: datetime
    run_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    error: str | None
    error_line: str | None


class JobSummary(JobSummaryFields[JobState], frozen=True, kw_only=True):
    """One job of a listing (see JobSummaryFields), as `list_jobs` and the dashboard's lists
    return it. `at` is its place in the listing's order (keyset): finished_at for a finished
    job; for a live one created_at in `list_jobs`, in the dashboard's lists the time its
    state orders by (queued_at, run_at, started_at). `error` is whole in `list_jobs`, its
    first 300 characters in the dashboard's lists."""

    expires_at: datetime | None
    at: datetime


class JobPage(msgspec.Struct, frozen=True, kw_only=True):
    """A page of `list_jobs`; pass `next` as `after` for the following page (None: the end)."""

    jobs: list[JobSummary]
    next: str | None


class Replayed(msgspec.Struct, frozen=True, kw_only=True):
    """What `replay` enqueued, and what it changed from the original's options."""

    id: str
    priority: int
    delay_s: float | None
    expires_at: datetime | None
    changes: list[str]


class Schedule(msgspec.Struct, frozen=True, kw_only=True):
    """A declared schedule: `name` is unique in the fleet; the payload is encoded JSON."""

    name: str
    job_type: str
    cron: str
    tz: str
    payload: bytes
    priority: int
    catch_up: bool


class ScheduleState(Schedule, frozen=True, kw_only=True):
    """A schedule as stored, with the last tick enqueued (None: never ran yet)."""

    declared_at: datetime
    last_tick: datetime | None


# -- batches (client/batches.py, store/batches.py) -------------------------------------------

BatchState = Literal["open", "sealed", "complete"]


class BatchDone(msgspec.Struct, frozen=True, kw_only=True):
    """The payload of a batch's callback job: annotate the callback handler's payload with
    it. `failed_ids` holds the first 1,000 ids (by id) of the jobs that did not succeed;
    `failed_ids_truncated` says there were more (`app.batch_status(id, failures=n)`)."""

    batch_id: str
    event: Literal["complete", "success"]
    total: int
    succeeded: int
    failed: int
    cancelled: int
    expired: int
    failed_ids: list[str]
    failed_ids_truncated: bool
    data: Any = None  # the batch's `data`: any JSON value (Any: `object` has no JSON Schema)


class BatchFailure(msgspec.Struct, frozen=True, kw_only=True):
    """A member of a batch that ended other than succeeded."""

    job_id: str
    name: str
    state: str


class BatchStatus(msgspec.Struct, frozen=True, kw_only=True):
    """A batch as stored: `open` takes jobs from anyone, `sealed` only from its own running
    jobs, `complete` none (its callbacks were enqueued, ids in *_job_id)."""

    id: str
    state: BatchState
    on_complete: str | None
    on_success: str | None
    priority: int
    total: int
    pending: int
    succeeded: int
    failed: int
    cancelled: int
    expired: int
    created_at: datetime
    sealed_at: datetime | None
    completed_at: datetime | None
    complete_job_id: str | None
    success_job_id: str | None
    data: Any = None  # the batch's `data`: any JSON value
    failures: list[BatchFailure] = msgspec.field(default_factory=list)


# -- streamed events (ctx.progress, ctx.emit; worker/streaming.py, client/streaming.py) ----

EventKind = Literal["progress", "emit", "end"]


class JobEvent(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One event of a job's stream, as `app.stream` yields it and as it travels on Redis and
    in server-sent events: a progress report (`done` of `total`, `note`), a partial result
    (`data`, with `dropped`: this attempt's emits dropped by the rate limit since the last
    one delivered), or the job's end (`state`, the last event of every stream)."""

    kind: EventKind
    job_id: str
    attempt: int = 0
    done: float | None = None
    total: float | None = None
    note: str | None = None
    data: object = None
    dropped: int = 0
    state: JobState | None = None
