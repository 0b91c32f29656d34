"""App: the job-type registry, and the calls web processes make (enqueue, get, cancel, replay).

enqueue: validate -> serialization -> store (commit) -> broker (push id). Validation happens
before the first write, so bad input stores nothing. A Redis failure after the commit is
logged and left to the coordinator's reconciler: the job is acknowledged once Postgres has it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import math
import random
import threading
import time
import unicodedata
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal, TypeVar, get_args

import msgspec
import psycopg
import redis
from loguru import logger

from hivejobs import waiting
from hivejobs.aio import AsyncBackends, AsyncBackendsByLoop
from hivejobs.broker import MAX_ID_LENGTH, Broker, ControlMessage, Pusher
from hivejobs.config import (
    DEFAULT_DATABASE_URL,
    DEFAULT_REDIS_URL,
    Settings,
    remember_secrets,
    settings_from_env,
)
from hivejobs.errors import (
    CallbackRefused,
    InvalidArgument,
    InvalidJobType,
    JobDuplicate,
    JobIdConflict,
    JobNotFinished,
    JobNotFound,
    PayloadInvalid,
    UnknownJobType,
)
from hivejobs.failpoints import failpoint
from hivejobs.flow import Limits, checked_limits, pause_type, paused_types, resume_type, scale_type
from hivejobs.integrations import adriver_connection, driver_connection
from hivejobs.logs import error_fields
from hivejobs.memory import checked_max_rss
from hivejobs.metrics import record_callback
from hivejobs.records import (
    JOB_TYPE_NAME_RE,
    PRIORITIES,
    Delivery,
    Inserted,
    JobInfo,
    JobPage,
    JobState,
    JobTypeInfo,
    NewJob,
    Replayed,
    UniqueClaim,
)
from hivejobs.schedules import Schedule, check_cron
from hivejobs.serialization import PayloadCodec, decode_json, payload_type_of
from hivejobs.store import Store, connection_failed
from hivejobs.store.enqueue import Push, owns_transaction

if TYPE_CHECKING:
    from hivejobs.chains.builder import Chain
    from hivejobs.embedded import EmbeddedServers
    from hivejobs.records import ChainStatus, ChainSummary, JobLogEntry, RunningTry
    from hivejobs.store.callbacks import CallbackResult

NAME_RE = JOB_TYPE_NAME_RE
# Unicode categories refused in ids: controls, format characters (RTL override, zero-width),
# line and paragraph separators, and lone surrogates (undecodable bytes; not storable).
_BAD_ID_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})
MAX_DELAY_S = 366 * 24 * 3600.0
Handler = Callable[..., object]
# A failed or cancelled job can be enqueued again at once, as Oban does by default.
UNIQUE_STATES = ("scheduled", "queued", "running", "succeeded")
_canonical = msgspec.json.Encoder(order="deterministic")  # key order does not make a new key
F = TypeVar("F", bound=Handler)


class Retry(Exception):  # noqa: N818 - control flow, named for what the handler asks
    """Raise in a handler to retry the job after `delay` seconds (counts as an attempt)."""

    def __init__(self, delay: float | None = None, reason: str | None = None) -> None:
        super().__init__(reason or "retry requested")
        if delay is not None:
            _check_delay(delay)
        self.delay = delay


class Fail(Exception):  # noqa: N818 - control flow, named for what the handler asks
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


@dataclass
class JobType:
    name: str
    handler: Handler | None
    concurrency: int
    processes: int
    attempts: int
    delivery: Delivery
    timeout_s: float | None
    backoff: Backoff
    priority: int
    codec: PayloadCodec = field(repr=False)
    # rickover's status callbacks: the handler hands the work to another service and returns;
    # the job stays running until that service posts the outcome (or the timeout passes).
    callback: bool = False
    callback_timeout_s: float | None = None
    unique: Unique | None = None
    retention_s: float | None = None  # archive retention of its finished jobs (None: global)
    limits: Limits | None = None  # fleet-wide limits (issue 12, flow.py)
    max_rss_mb: float | None = None  # recycle its pool processes above this (memory.py)

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
        )


class App:
    """Register job types with @app.job; enqueue from anywhere the app is importable."""

    def __init__(
        self,
        database_url: str | None = None,
        redis_url: str | None = None,
        prefix: str | None = None,
        **settings: float | int | str,
    ) -> None:
        self.settings: Settings = settings_from_env(database_url, redis_url, prefix, **settings)
        self.types: dict[str, JobType] = {}
        self.schedules: dict[str, Schedule] = {}
        self._store: Store | None = None
        self._read_store: Store | None = None
        self._broker: Broker | None = None
        self._pusher: Pusher | None = None
        self.embedded: EmbeddedServers | None = None
        self._lock = threading.RLock()
        self._remote_types: tuple[float, dict[str, JobTypeInfo]] = (0.0, {})
        self._async = AsyncBackendsByLoop()

    # -- registry ----------------------------------------------------------------------

    def job(
        self,
        name: str,
        *,
        concurrency: int = 8,
        processes: int = 1,
        attempts: int | None = None,
        delivery: Delivery = "at_least_once",
        timeout: float | None = None,
        backoff: Backoff | None = None,
        priority: int = 0,
        cron: str | None = None,
        tz: str = "UTC",
        catch_up: bool = False,
        unique_for: float | None = None,
        unique_by: Sequence[str] | None = None,
        unique_states: Sequence[str] = UNIQUE_STATES,
        on_duplicate: str = "return",
        callback: bool = False,
        callback_timeout: float = 3600.0,
        retention: float | None = None,
        global_concurrency: int | None = None,
        rate: str | None = None,
        burst: int | None = None,
        max_rss_mb: float | None = None,
    ) -> Callable[[F], F]:
        """Register a handler `fn(ctx, payload)` as job type `name`.

        `cron` also runs it periodically with a `None` payload (see `periodic`).
        `unique_for` seconds: a job whose payload (or its `unique_by` fields) matches a job
        of this type enqueued within that window and still in one of `unique_states` is not
        stored again; `enqueue` returns the existing id (or raises JobDuplicate with
        `on_duplicate="raise"`). Enforced by a Postgres primary key, so racing enqueuers on
        many machines store one job.

        `callback=True`: the handler starts work elsewhere and returns; the job stays running
        until the other service reports the attempt's outcome (`complete_callback`, or POST
        /v1/jobs/{name}/{id}), or `callback_timeout` seconds pass (then it is retried like a
        failed attempt while attempts are left, else failed).

        `retention`: seconds its finished jobs stay in the archive (default: the
        `archive_retention_s` setting), e.g. a day for chatty jobs, a year for payments.

        Fleet-wide limits, across every instance (flow.py): `global_concurrency` jobs of this
        type running at once; `rate="100/s"` (or "/m", "/h") starts, from a token bucket of
        `burst` starts (default one second's worth). A job over a limit waits queued.

        `max_rss_mb`: a pool process whose resident memory passes it finishes its running
        jobs and is forked again (a suspension of what still runs, not a failure)."""
        jt = self._validated_type(
            name, concurrency, processes, attempts, delivery, timeout, priority
        )
        jt.limits = checked_limits(global_concurrency, rate, burst)  # issue 12 hook
        jt.max_rss_mb = checked_max_rss(max_rss_mb)  # issue 12 hook
        if cron is not None:
            check_cron(cron, tz)
        if unique_for is not None:
            jt.unique = _checked_unique(unique_for, unique_by, unique_states, on_duplicate)
        if callback:
            if not (callback_timeout > 0 and math.isfinite(callback_timeout)):
                raise InvalidJobType(
                    f"callback_timeout must be a positive number of seconds, not {callback_timeout}"
                )
            jt.callback, jt.callback_timeout_s = True, float(callback_timeout)
        if retention is not None and not (
            isinstance(retention, int | float) and 0 < retention < math.inf
        ):
            raise InvalidJobType(f"retention must be a positive number of seconds, not {retention}")
        jt.retention_s = None if retention is None else float(retention)

        def register(fn: F) -> F:
            jt.handler = fn
            jt.backoff = backoff or Backoff()
            jt.codec = PayloadCodec(name, payload_type_of(fn), self.settings.max_payload_bytes)
            self.types[name] = jt
            if cron is not None:
                self.periodic(name, cron, tz=tz, catch_up=catch_up)
            return fn

        return register

    def periodic(
        self,
        job_type: str,
        cron: str,
        payload: object = None,
        *,
        name: str | None = None,
        tz: str = "UTC",
        catch_up: bool = False,
        priority: int | None = None,
    ) -> None:
        """Enqueue a job of `job_type` at every tick of `cron` (5 fields, or 6 with seconds
        last), read in time zone `tz`. The active coordinator enqueues exactly one job per
        tick across the fleet. Ticks missed while no coordinator ran are skipped, or all
        enqueued with `catch_up=True`. `name` (default: the job type) identifies the
        schedule; declare several per type under different names."""
        jt = self.types.get(job_type)
        if jt is None:
            raise UnknownJobType(job_type, sorted(self.types))
        key = job_type if name is None else name
        if not NAME_RE.fullmatch(key):
            raise InvalidJobType(f"schedule name {key!r} must be 1-64 letters, digits, _.-")
        if key in self.schedules:
            raise InvalidJobType(f"schedule {key!r} is declared twice")
        check_cron(cron, tz)
        prio = jt.priority if priority is None else priority
        _check_priority(prio)
        self.schedules[key] = Schedule(
            name=key,
            job_type=job_type,
            cron=cron,
            tz=tz,
            payload=jt.codec.encode(payload),
            priority=prio,
            catch_up=catch_up,
        )

    def _validated_type(
        self,
        name: str,
        concurrency: int,
        processes: int,
        attempts: int | None,
        delivery: str,
        timeout: float | None,
        priority: int,
    ) -> JobType:
        if not isinstance(name, str) or not NAME_RE.fullmatch(name):
            raise InvalidJobType(f"job type name {name!r} must be 1-64 letters, digits, _.-")
        if name in self.types:
            raise InvalidJobType(f"job type {name!r} is registered twice")
        if delivery not in ("at_least_once", "at_most_once"):
            raise InvalidJobType(
                f"delivery must be 'at_least_once' or 'at_most_once', not {delivery!r}"
            )
        if delivery == "at_most_once" and attempts not in (None, 1):
            raise InvalidJobType(
                f"job type {name!r} is at_most_once, so it runs at most one attempt: "
                f"attempts={attempts} is impossible (drop it or use at_least_once)"
            )
        resolved = attempts if attempts is not None else (1 if delivery == "at_most_once" else 5)
        if resolved < 1:
            raise InvalidJobType(f"attempts must be at least 1, not {resolved}")
        if concurrency < 1 or processes < 1:
            raise InvalidJobType("concurrency and processes must be at least 1")
        if timeout is not None and not (timeout > 0 and math.isfinite(timeout)):
            raise InvalidJobType(f"timeout must be a positive number of seconds, not {timeout}")
        _check_priority(priority)
        codec = PayloadCodec(name, None, self.settings.max_payload_bytes)
        return JobType(
            name,
            None,
            concurrency,
            processes,
            resolved,
            delivery,  # type: ignore[arg-type]
            timeout,
            Backoff(),
            priority,
            codec,
        )

    def job_type(self, name: str) -> JobType:
        """A registered type, or one a running worker fleet declared in Postgres (CLI use)."""
        jt = self.types.get(name)
        if jt is not None:
            return jt
        remote = self._declared_types()
        info = remote.get(name)
        if info is None:
            raise UnknownJobType(name, sorted(set(self.types) | set(remote)))
        return JobType(
            name,
            None,
            info.concurrency,
            info.processes,
            info.attempts,
            info.delivery,
            info.timeout_s,
            Backoff(),
            0,
            PayloadCodec(name, None, self.settings.max_payload_bytes),
            callback=info.callback,
            callback_timeout_s=info.callback_timeout_s,
        )

    def _declared_types(self) -> dict[str, JobTypeInfo]:
        at, cached = self._remote_types
        if time.monotonic() - at > 5.0:
            try:
                cached = {t.name: t for t in self.store.job_types()}
            except psycopg.OperationalError:
                if not cached:
                    raise
                return cached  # a stale list beats failing while Postgres blinks
            self._remote_types = (time.monotonic(), cached)
        return cached

    @contextlib.contextmanager
    def _postgres_errors(self) -> Iterator[None]:
        """A lost or refused connection surfaces as ConnectionFailed, with a redacted URL."""
        try:
            yield
        except psycopg.OperationalError as exc:
            raise connection_failed(self.settings.database_url, exc) from None

    # -- connections -------------------------------------------------------------------

    def resolve_backends(self) -> None:
        """Without configured URLs, pick the local servers or start embedded ones (once).

        Called on first connection, so importing an app never starts servers."""
        if self.settings.backend_source != "default":
            return
        with self._lock:
            if self.settings.backend_source != "default":
                return
            from hivejobs.embedded import choose_backends

            chosen = choose_backends(
                None
                if self.settings.database_url == DEFAULT_DATABASE_URL
                else self.settings.database_url,
                None if self.settings.redis_url == DEFAULT_REDIS_URL else self.settings.redis_url,
            )
            self.settings.database_url = chosen.database_url
            self.settings.redis_url = chosen.redis_url
            self.settings.backend_source = chosen.source
            remember_secrets(chosen.database_url, chosen.redis_url)
            self.embedded = chosen.embedded

    @property
    def store(self) -> Store:
        if self._store is None:
            self.resolve_backends()
            with self._lock:
                if self._store is None:
                    store = Store(self.settings.database_url, pooled=self.settings.pgbouncer)
                    store.check_schema()
                    self._store = store
        return self._store

    @property
    def read_store(self) -> Store:
        """The store listings and dashboards read from: HIVEJOBS_READ_DATABASE_URL (e.g. a
        replica, which may lag) when set, else the primary's."""
        if not self.settings.read_database_url:
            return self.store
        if self._read_store is None:
            with self._lock:
                if self._read_store is None:
                    self._read_store = Store(
                        self.settings.read_database_url, max_size=2, pooled=self.settings.pgbouncer
                    )
        return self._read_store

    @property
    def pusher(self) -> Pusher:
        if self._pusher is None:
            with self._lock:
                if self._pusher is None:
                    self._pusher = Pusher(self.broker)
        return self._pusher

    @property
    def broker(self) -> Broker:
        if self._broker is None:
            self.resolve_backends()
            with self._lock:
                if self._broker is None:
                    self._broker = Broker(self.settings)
        return self._broker

    def migrate(self) -> list[str]:
        """Create the database if missing and apply pending migrations (idempotent)."""
        from hivejobs.store import create_database_if_missing

        self.resolve_backends()
        create_database_if_missing(self.settings.database_url)
        store = Store(self.settings.database_url, pooled=self.settings.pgbouncer)
        try:
            return store.migrate()
        finally:
            store.close()

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait until the ids of jobs enqueued so far were pushed to Redis."""
        return self._pusher is None or self._pusher.flush(timeout_s)

    def close(self) -> None:
        self.flush()
        # The pusher holds the broker being closed: a later enqueue makes a new pair (with
        # the settings of then, which hivejobs.testing changes between tests).
        self._pusher = None
        if self._store is not None:
            self._store.close()
            self._store = None
        if self._read_store is not None:
            self._read_store.close()
            self._read_store = None
        if self._broker is not None:
            self._broker.close()
            self._broker = None

    # -- enqueue -----------------------------------------------------------------------

    def enqueue(
        self,
        name: str,
        payload: object = None,
        *,
        id: str | None = None,  # noqa: A002
        priority: int | None = None,
        delay: float | None = None,
        run_at: datetime | None = None,
        expires_at: datetime | None = None,
        conn: object | None = None,
    ) -> str:
        """Store the job and dispatch it; returns its id.

        The same id with the same payload returns the existing job; a different payload
        raises JobIdConflict.

        `conn` puts the job in the caller's transaction: a psycopg `Connection`, a SQLAlchemy
        `Connection` or `Session` (postgresql+psycopg), or Django's `connection`. hivejobs
        never commits, rolls back or closes it: the job exists, and is dispatched (NOTIFY,
        delivered on commit), only if the caller commits. The one exception is an autocommit
        connection with no transaction open, where the enqueue is its own transaction.
        """
        with self._postgres_errors():
            jt = self.job_type(name)
        job = _new_job(jt, payload, id, priority, delay, run_at, expires_at)
        raw = driver_connection(conn) if conn is not None else None
        own = raw is None or owns_transaction(raw)
        with self._postgres_errors():
            # On an error the job is not acknowledged; if the connection died during COMMIT
            # it may be stored: enqueue again with the same id to be sure (idempotent).
            inserted = self.store.insert_job(job, id is not None, raw)
        job_id, created = _outcome(jt, job, inserted)
        if created and own:
            failpoint("enqueue.after_commit_before_push")
            self.pusher.submit(job.name, job.priority, [job.id])
        return job_id

    async def aenqueue(
        self,
        name: str,
        payload: object = None,
        *,
        id: str | None = None,  # noqa: A002
        priority: int | None = None,
        delay: float | None = None,
        run_at: datetime | None = None,
        expires_at: datetime | None = None,
        conn: object | None = None,
    ) -> str:
        """`enqueue` for event loops; `conn` is a psycopg `AsyncConnection` or a SQLAlchemy
        `AsyncConnection` / `AsyncSession`, with the same transaction rules."""
        jt = await self._ajob_type(name)
        job = _new_job(jt, payload, id, priority, delay, run_at, expires_at)
        raw = await adriver_connection(conn) if conn is not None else None
        own = raw is None or owns_transaction(raw)
        backends = await self.async_backends()
        with self._postgres_errors():
            inserted = await backends.store.insert_job(job, id is not None, raw)
        job_id, created = _outcome(jt, job, inserted)
        if created and own:
            failpoint("enqueue.after_commit_before_push")
            await self._apush(backends, [(job.id, job.name, job.priority)])
        return job_id

    def enqueue_many(
        self,
        name: str,
        payloads: Iterable[object],
        *,
        priority: int | None = None,
        delay: float | None = None,
        expires_at: datetime | None = None,
        conn: object | None = None,
    ) -> list[str]:
        """Validate every payload first (one bad one stores nothing), then COPY them in, in
        `conn`'s transaction if given (as `enqueue`)."""
        with self._postgres_errors():
            jt = self.job_type(name)
        jobs = _new_jobs(jt, payloads, priority, delay, expires_at)
        if not jobs:
            return []
        raw = driver_connection(conn) if conn is not None else None
        with self._postgres_errors():
            pushes = self.store.insert_many(jobs, raw)
        if pushes:
            self._push(name, pushes[0][2], [job_id for job_id, _, _ in pushes])
        return [j.id for j in jobs]

    async def aenqueue_many(
        self,
        name: str,
        payloads: Iterable[object],
        *,
        priority: int | None = None,
        delay: float | None = None,
        expires_at: datetime | None = None,
        conn: object | None = None,
    ) -> list[str]:
        """`enqueue_many` for event loops."""
        jt = await self._ajob_type(name)
        jobs = _new_jobs(jt, payloads, priority, delay, expires_at)
        if not jobs:
            return []
        raw = await adriver_connection(conn) if conn is not None else None
        backends = await self.async_backends()
        with self._postgres_errors():
            pushes = await backends.store.insert_many(jobs, raw)
        await self._apush(backends, pushes)
        return [j.id for j in jobs]

    async def _ajob_type(self, name: str) -> JobType:
        """A registered type at once; a declared one is read in a thread (it may query)."""
        jt = self.types.get(name)
        if jt is not None:
            return jt
        with self._postgres_errors():
            return await asyncio.to_thread(self.job_type, name)

    def _push(self, name: str, priority: int, ids: Sequence[str]) -> None:
        try:
            self.broker.push(name, priority, ids)
        except redis.RedisError as exc:
            # PG is the truth: the job is stored; the reconciler pushes it later (R1).
            logger.warning(
                "job stored but push to Redis failed; the coordinator will dispatch it",
                job_type=name,
                jobs=len(ids),
                **error_fields(exc),
            )

    async def _apush(self, backends: AsyncBackends, pushes: Sequence[Push]) -> None:
        if not pushes:
            return
        _, name, priority = pushes[0]  # one call enqueues one type at one priority
        try:
            await backends.broker.push(name, priority, [job_id for job_id, _, _ in pushes])
        except redis.RedisError as exc:
            logger.warning(
                "job stored but push to Redis failed; the coordinator will dispatch it",
                job_type=name,
                jobs=len(pushes),
                **error_fields(exc),
            )

    async def async_backends(self) -> AsyncBackends:
        """This event loop's async Postgres pool and Redis client, opened on first use."""
        if self.settings.backend_source == "default":
            await asyncio.to_thread(self.resolve_backends)
        with self._postgres_errors():
            return await self._async.get(self.settings)

    async def aclose(self) -> None:
        """Close this event loop's async connections (from the web app's shutdown hook)."""
        await self._async.close()

    # -- reads and user actions --------------------------------------------------------

    def get_job(self, job_id: str) -> JobInfo:
        _check_id(job_id)
        return _job_info(job_id, self.store.get_row(job_id))

    async def aget_job(self, job_id: str) -> JobInfo:
        _check_id(job_id)
        backends = await self.async_backends()
        with self._postgres_errors():
            return _job_info(job_id, await backends.store.get_row(job_id))

    def cancel(self, job_id: str) -> bool:
        """Cancel a waiting job now, or tell a running one to stop (it ends `cancelled`
        unless it succeeds first). False when the job has already finished."""
        _check_id(job_id)
        outcome = self.store.cancel(job_id)
        if outcome is None:
            self.get_job(job_id)  # raises JobNotFound for unknown ids
            return False
        if outcome == "requested":
            try:
                self.broker.publish_control(ControlMessage(action="cancel", job_id=job_id))
            except redis.RedisError as exc:
                logger.warning(
                    "cancel stored but not broadcast; the job ends cancelled if it fails",
                    job_id=job_id,
                    **error_fields(exc),
                )
        return True

    def complete_callback(
        self,
        name: str,
        job_id: str,
        *,
        status: Literal["succeeded", "failed"],
        attempt: int,
        retryable: bool = False,
        error: str | None = None,
    ) -> CallbackResult:
        """The other service's outcome for attempt `attempt` of a callback job (rickover).

        A failed, retryable callback with attempts left is retried after the type's backoff;
        otherwise the job ends `status`. A wrong attempt or a job that is not running raises
        CallbackRefused (HTTP 409); an unknown job JobNotFound."""
        from hivejobs.store.callbacks import CallbackStore

        jt = self.job_type(name)
        if not jt.callback:
            raise CallbackRefused(f"job type {name!r} does not take status callbacks")
        if status not in ("succeeded", "failed"):
            raise InvalidArgument(f"status must be 'succeeded' or 'failed', not {status!r}")
        delay = jt.backoff.delay_s(attempt) if status == "failed" and retryable else None
        text = (
            error if error is not None else (None if status == "succeeded" else "callback: failed")
        )
        result = CallbackStore(self.store).complete(name, job_id, attempt, status, delay, text)
        if result.outcome is None:
            if result.state is None:
                raise JobNotFound(job_id)
            raise CallbackRefused(
                f"job {job_id!r} is {result.state} at attempt {result.attempt}: a callback for "
                f"attempt {attempt} is refused (only a running job's current attempt takes one)"
            )
        record_callback(self, name, result.outcome)
        return result

    # -- waiting (issue 12 hook: the logic is in waiting.py) ------------------------------

    def wait(self, job_id: str, timeout: float | None = None) -> JobInfo:
        """Block until the job finishes and return it (state, attempt, error, result).
        Woken by a Postgres NOTIFY when it is archived, not by polling. Raises WaitTimeout
        after `timeout` seconds (None: no limit), JobNotFound for an unknown id."""
        _check_id(job_id)
        return waiting.wait(self, job_id, timeout)

    async def await_job(self, job_id: str, timeout: float | None = None) -> JobInfo:
        """`wait` for event loops: `info = await app.await_job(job_id, timeout=30)`."""
        _check_id(job_id)
        return await waiting.await_job(self, job_id, timeout)

    # -- flow control (issue 12 hook: the logic is in flow.py) ----------------------------

    def pause(self, name: str) -> bool:
        """Pause job type `name` across the fleet: running jobs finish, nothing new starts,
        queued jobs wait, through restarts and Redis flushes. False if it was paused."""
        self.job_type(name)  # UnknownJobType, with the names it knows
        return pause_type(self.store, name)

    def resume(self, name: str) -> bool:
        """Let a paused type run again (within a second). False if it was not paused."""
        self.job_type(name)
        return resume_type(self.store, name)

    def scale(self, name: str, concurrency: int | None) -> None:
        """Runner threads per pool process of `name`, across the fleet, without a restart
        (pools look within a second); None: back to the type's own `concurrency`. A
        scale-down interrupts no running job: pools just claim less."""
        self.job_type(name)
        scale_type(self.store, name, concurrency)

    def paused(self) -> list[str]:
        """The paused job types."""
        return paused_types(self.store)

    def replay(self, job_id: str) -> str:
        """Enqueue a finished job again, as a new job with a new id; returns that id.
        Its options are kept as `replay_job` says (and logs)."""
        return self.replay_job(job_id).id

    def replay_job(self, job_id: str) -> Replayed:
        """Enqueue a finished job again with its original options, as rickover's replay:
        priority as is, its delay (run_at - created_at) again from now, and its expires_at,
        moved by as much as the replay comes later when it has passed. `changes` says what
        differs from the original, for the caller to show."""
        info = self.get_job(job_id)
        if info.state not in ("succeeded", "failed", "cancelled", "expired"):
            raise JobNotFinished(job_id, info.state)
        from hivejobs.listing import replay_options

        plan = replay_options(info, datetime.now(UTC))
        new_id = self.enqueue(
            info.name,
            info.payload,
            priority=plan.priority,
            delay=plan.delay_s,
            expires_at=plan.expires_at,
        )
        logger.info("job replayed", job_id=job_id, new_id=new_id, changes=plan.changes)
        return Replayed(
            id=new_id,
            priority=plan.priority,
            delay_s=plan.delay_s,
            expires_at=plan.expires_at,
            changes=plan.changes,
        )

    def list_jobs(
        self,
        state: str | Sequence[str] | None = None,
        type: str | None = None,  # noqa: A002 - the job type, as the CLI's --type
        since: datetime | timedelta | None = None,
        until: datetime | None = None,
        limit: int = 100,
        after: str | None = None,
    ) -> JobPage:
        """Live and archived jobs, newest first (by finished_at, or created_at while live),
        filtered by state(s), job type and time; `since` is a moment or a span back from
        now (judged on the database clock). Keyset-paginated: pass the page's `next` as
        `after`. A job that finishes while you page may appear on two pages."""
        from hivejobs.listing import list_jobs

        return list_jobs(self, state, type, since, until, limit, after)

    # -- chains (hivejobs.chains.api does the work) ----------------------------------------

    def run_chain(self, chain: Chain, conn: object | None = None) -> str:
        """Validate and store a chain (ChainInvalid stores nothing); returns its request id.
        `conn`: in the caller's transaction, with the rules of `enqueue`."""
        from hivejobs.chains.api import run_chain

        return run_chain(self, chain, conn)

    async def arun_chain(self, chain: Chain, conn: object | None = None) -> str:
        """`run_chain` for event loops."""
        from hivejobs.chains.api import arun_chain

        return await arun_chain(self, chain, conn)

    def chain_status(self, request_id: str) -> ChainStatus:
        from hivejobs.chains.api import chain_status

        return chain_status(self, request_id)

    def stop_chain(self, request_id: str, timeout: float | None = None, wait: bool = False) -> bool:
        """Stop a live chain; False when it had already finished. It ends `stopped`, or
        `failed` when one of its jobs had failed for good. Tries that ignore ctx.stopping
        are abandoned after `timeout` seconds (default `chain_stop_timeout_s`, 30) and the
        job log says so. `wait`: return once every try has ended (or was abandoned)."""
        from hivejobs.chains.api import stop_chain

        return stop_chain(self, request_id, timeout, wait)

    def job_log(self, request_id: str) -> list[JobLogEntry]:
        """One entry per try of every job of the chain, in the order they finished."""
        from hivejobs.chains.api import job_log

        return job_log(self, request_id)

    def list_chains(
        self,
        limit: int = 50,
        *,
        state: str | Sequence[str] | None = None,
        type: str | None = None,  # noqa: A002 - the chain's name, spincycle's request type
        job_type: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        before: tuple[datetime, str] | None = None,
    ) -> list[ChainSummary]:
        """Chains newest first, filtered by state(s), type (the chain's name), job type and
        creation time; `before` = (created_at, id) of the last chain of a previous page."""
        from hivejobs.chains.api import chain_query, list_chains

        query = chain_query(state, type, job_type, since, until, before, limit)
        return list_chains(self, query)

    def chain_ps(self, limit: int = 500) -> list[RunningTry]:
        """What runs now across the fleet (spincycle's `ps`): each live chain try with its
        host, pid, status text and age."""
        from hivejobs.chains.api import running_tries

        return running_tries(self, limit)


def _checked_options(
    jt: JobType,
    job_id: str | None,
    priority: int | None,
    delay: float | None,
    run_at: datetime | None,
    expires_at: datetime | None,
) -> int:
    """Refuse bad enqueue options before anything is written; returns the priority."""
    if job_id is not None:
        _check_id(job_id)
    prio = jt.priority if priority is None else priority
    _check_priority(prio)
    if delay is not None and run_at is not None:
        raise InvalidArgument("give either delay or run_at, not both")
    if delay is not None:
        _check_delay(delay)
    for label, moment in (("run_at", run_at), ("expires_at", expires_at)):
        if moment is not None and not isinstance(moment, datetime):
            raise InvalidArgument(f"{label} must be a datetime, not {type(moment).__name__}")
        if moment is not None and moment.tzinfo is None:
            raise InvalidArgument(f"{label} must be timezone-aware (e.g. datetime.now(UTC))")
    if expires_at is not None and expires_at.timestamp() <= time.time():
        raise InvalidArgument("expires_at is already in the past")
    return prio


def _new_job(
    jt: JobType,
    payload: object,
    job_id: str | None,
    priority: int | None,
    delay: float | None,
    run_at: datetime | None,
    expires_at: datetime | None,
) -> NewJob:
    """Check the options and encode the payload: bad input raises before any write."""
    prio = _checked_options(jt, job_id, priority, delay, run_at, expires_at)
    encoded = jt.codec.encode(payload)
    return NewJob(
        id=job_id or str(uuid.uuid4()),
        name=jt.name,
        priority=prio,
        attempts=jt.attempts,
        delivery=jt.delivery,
        payload=encoded,
        delay_s=delay,
        run_at=run_at,
        expires_at=expires_at,
        unique=None if jt.unique is None else jt.unique.claim(jt.name, encoded),
    )


def _new_jobs(
    jt: JobType,
    payloads: Iterable[object],
    priority: int | None,
    delay: float | None,
    expires_at: datetime | None,
) -> list[NewJob]:
    """Every payload checked first: one bad one stores nothing."""
    if jt.unique is not None:
        raise InvalidArgument(
            f"job type {jt.name!r} is unique: enqueue its jobs one by one (enqueue_many "
            "stores with COPY, which cannot take unique keys)"
        )
    batch = list(payloads)
    if not batch:
        return []
    prio = _checked_options(jt, None, priority, delay, None, expires_at)  # once for all
    return [_new_job(jt, p, None, prio, delay, None, expires_at) for p in batch]


def _outcome(jt: JobType, job: NewJob, inserted: Inserted) -> tuple[str, bool]:
    """The id `enqueue` returns, and whether this call stored a queued job to dispatch now.

    An existing id with the same type and payload is an idempotent retry; with another, a
    conflict (unless the job finished and was pruned meanwhile). A duplicate in a unique
    window returns the key's job, or raises."""
    if inserted.state == "duplicate":
        if jt.unique is not None and jt.unique.on_duplicate == "raise":
            raise JobDuplicate(jt.name, inserted.id)
        return inserted.id, False
    if not inserted.created:
        if inserted.name != job.name or inserted.payload != job.payload:
            if inserted.state != "gone":
                raise JobIdConflict(job.id)
        return job.id, False
    return job.id, inserted.state == "queued"


def _checked_unique(
    window_s: float, by: Sequence[str] | None, states: Sequence[str], on_duplicate: str
) -> Unique:
    if isinstance(window_s, bool) or not isinstance(window_s, int | float):
        raise InvalidJobType(f"unique_for must be seconds, not {type(window_s).__name__}")
    if not (0 < window_s <= MAX_DELAY_S):  # also refuses NaN
        raise InvalidJobType(
            f"unique_for must be between 0 and {MAX_DELAY_S:.0f} s, not {window_s}"
        )
    unknown = [st for st in states if st not in get_args(JobState)]
    if unknown or not states or isinstance(states, str):
        raise InvalidJobType(f"unique_states must be job states from {get_args(JobState)}")
    if by is not None and (isinstance(by, str) or not all(isinstance(f, str) for f in by)):
        raise InvalidJobType("unique_by must be a list of payload field names")
    if on_duplicate not in ("return", "raise"):
        raise InvalidJobType(f"on_duplicate must be 'return' or 'raise', not {on_duplicate!r}")
    return Unique(float(window_s), None if by is None else tuple(by), tuple(states), on_duplicate)


def _job_info(job_id: str, row: dict[str, Any] | None) -> JobInfo:
    if row is None:
        raise JobNotFound(job_id)
    row["payload"] = decode_json(bytes(row["payload"]), row["name"])
    row["result"] = decode_json(bytes(row["result"]) if row["result"] else None, row["name"])
    return JobInfo(**row)


def _check_delay(delay: float) -> None:
    if isinstance(delay, bool) or not isinstance(delay, int | float):
        raise InvalidArgument(f"delay must be a number of seconds, not {type(delay).__name__}")
    if not (0 <= delay <= MAX_DELAY_S):  # also refuses NaN
        raise InvalidArgument(f"delay must be between 0 and {MAX_DELAY_S:.0f} seconds, not {delay}")


def _check_priority(priority: int) -> None:
    if isinstance(priority, bool) or not isinstance(priority, int) or priority not in PRIORITIES:
        raise InvalidArgument(f"priority must be an integer 0-9 (0 runs first), not {priority!r}")


def _check_id(job_id: object) -> None:
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
