"""App: the job-type registry, and the calls web processes make (enqueue, get, cancel, replay).

enqueue: validate -> serialization -> store (commit) -> broker (push id). Validation happens
before the first write, so bad input stores nothing. A Redis failure after the commit is
logged and left to the coordinator's reconciler: the job is acknowledged once Postgres has it.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import os
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

import psycopg
import redis
from loguru import logger

from hivejobs import tracing
from hivejobs.broker import Broker, ControlMessage, Pusher
from hivejobs.broker.fair import FairBy, checked_fair, place
from hivejobs.client import streaming, waiting
from hivejobs.client.aio import AsyncBackends
from hivejobs.client.batches import (
    AsyncBatch,
    Batch,
    acreate_batch,
    batch_params,
    batch_status,
    create_batch,
    job_batch,
)
from hivejobs.client.chains import ChainClient, chain_query
from hivejobs.client.connections import Connections
from hivejobs.client.integrations import adriver_connection, driver_connection
from hivejobs.config import Settings, settings_from_env
from hivejobs.debounce import Unique
from hivejobs.errors import (
    CallbackRefused,
    InvalidArgument,
    JobNotFinished,
    JobNotFound,
    UnknownJobType,
    UsageError,
)
from hivejobs.failpoints import failpoint
from hivejobs.flow import (
    checked_limits,
    pause_type,
    paused_types,
    resume_type,
    scale_type,
    type_settings,
)
from hivejobs.jobtypes import (
    UNIQUE_STATES,
    Backoff,
    F,
    JobType,
    check_callback_timeout,
    check_id,
    check_retention,
    checked_unique,
    declare_type,
    declared_type,
    new_schedule,
    unique_policies,
)
from hivejobs.logs import error_fields
from hivejobs.metrics import record_callback
from hivejobs.payload_schema import RemoteSchemas
from hivejobs.records import (
    Delivery,
    JobEvent,
    JobInfo,
    JobPage,
    JobTypeInfo,
    NewJob,
    Replayed,
    TypeFlow,
)
from hivejobs.schedules import Schedule, check_cron
from hivejobs.sequence import checked_sequence
from hivejobs.serialization import PayloadCodec, decode_json, payload_type_of, storable_text
from hivejobs.store import Store
from hivejobs.store.enqueue import Push, owns_transaction
from hivejobs.store.fair import FairStore, KeyCount
from hivejobs.store.sequence import KeyState, SequenceStore
from hivejobs.worker.memory import checked_max_rss
from hivejobs.worker.placement import check_pool

if TYPE_CHECKING:
    from hivejobs.chains.builder import Chain
    from hivejobs.embedded.servers import EmbeddedServers
    from hivejobs.records import BatchStatus, ChainStatus, ChainSummary, JobLogEntry, RunningTry
    from hivejobs.store.callbacks import CallbackResult


class App:
    """Register job types with @app.job; enqueue from anywhere the app is importable.

    A facade: the checks live in jobtypes.py, the connections in Connections, the chain
    calls in ChainClient, the backend choice in backends.py, the SQL in store/. It owns the
    registry (`types` and `schedules`, filled while the app module is imported, read-only
    afterwards) and a short cache of the types a worker fleet declared (`_remote_types`)."""

    def __init__(
        self,
        database_url: str | None = None,
        redis_url: str | None = None,
        prefix: str | None = None,
        *,
        testing: Literal["inline"] | None = None,
        **settings: float | int | str,
    ) -> None:
        """`testing="inline"`: for tests, `enqueue` runs each job at once in the caller with
        no Postgres or Redis (hivejobs.client.inline says what differs)."""
        self.settings: Settings = settings_from_env(database_url, redis_url, prefix, **settings)
        self.types: dict[str, JobType] = {}
        self.schedules: dict[str, Schedule] = {}
        self.process_start_hooks: list[Callable[[], object]] = []  # on_process_start
        self.connections = Connections(self.settings)
        self._remote_types: tuple[float, dict[str, JobTypeInfo]] = (0.0, {})
        self._remote_schemas = RemoteSchemas()
        self.testing = testing  # `hivejobs run` refuses such an app: it has nothing to serve
        if testing is not None:
            from hivejobs.client.inline import install

            install(self, testing)

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
        unique: Unique | None = None,
        callback: bool = False,
        callback_timeout: float = 3600.0,
        retention: float | None = None,
        global_concurrency: int | None = None,
        rate: str | None = None,
        burst: int | None = None,
        limit_by: str | None = None,
        max_rss_mb: float | None = None,
        pool: str | None = None,
        fair_by: str | None = None,
        fair_weights: Mapping[str | int, int] | None = None,
        sequence_by: str | None = None,
        on_failure: str | None = None,
    ) -> Callable[[F], F]:
        """Register a handler `fn(ctx, payload)` as job type `name`.

        `cron` also runs it periodically with a `None` payload (see `periodic`).
        `unique_for` seconds: a job whose payload (or its `unique_by` fields) matches a job
        of this type enqueued within that window and still in one of `unique_states` is not
        stored again; `enqueue` returns the existing id (or raises JobDuplicate with
        `on_duplicate="raise"`). Enforced by a Postgres primary key, so racing enqueuers on
        many machines store one job.

        `unique=Unique(key=[...], within=s, mode=...)`: the same window (mode="window"), or
        mode="debounce" (the key's last enqueue runs, after `within` s of quiet, at most
        `max_wait` s after the first) or mode="coalesce" (later enqueues are merged into the
        waiting job by `merge`); hivejobs/debounce.py defines them.

        `callback=True`: the handler starts work elsewhere and returns; the job stays running
        until the other service reports the attempt's outcome (`complete_callback`, or POST
        /v1/jobs/{name}/{id}), or `callback_timeout` seconds pass (then it is retried like a
        failed attempt while attempts are left, else failed).

        `retention`: seconds its finished jobs stay in the archive (default: the
        `archive_retention_s` setting), e.g. a day for chatty jobs, a year for payments.

        Fleet-wide limits, across every instance (flow.py): `global_concurrency` jobs of this
        type running at once; `rate="100/s"` (or "/m", "/h") starts, from a token bucket of
        `burst` starts (default one second's worth). A job over a limit waits queued.
        `limit_by="customer_id"` makes `global_concurrency` and `rate` bounds per value of
        that payload field (at most N running, and its own token bucket, per customer); its
        payloads must be JSON objects holding the field (PayloadInvalid at enqueue
        otherwise).

        `max_rss_mb`: a pool process whose resident memory passes it finishes its running
        jobs and is forked again (a suspension of what still runs, not a failure).

        `pool="small"`: run in one process with the other types of that pool
        (worker/placement.py), each
        keeping its own concurrency, delivery, timeout, limits and retries; they share the
        process's connections, memory cap and restarts, so `processes` and `max_rss_mb`
        must be the same for every type of a pool. None: a process of its own.

        `fair_by="customer_id"`: jobs are handed out round-robin across the values of that
        payload field (broker/fair.py), so one key's backlog never starves another's;
        `fair_weights={"big": 4}` gives a key that many jobs per turn (others: 1). Payloads
        must be JSON objects holding the field as a string or integer (PayloadInvalid at
        enqueue otherwise). docs/howto/fair-dispatch.md says where the guarantee ends.

        `sequence_by="account_id"`: at most one job per value of that payload field runs at a
        time, in enqueue order, fleet-wide (sequence.py, docs/howto/sequences.md); payloads
        must hold the field (PayloadInvalid at enqueue otherwise). A failed attempt with
        attempts left holds the key until its retry; a job failed for good holds it until
        it is replayed or the key released (`on_failure="hold"`, the default), or lets the
        key go on (`on_failure="continue"`)."""
        jt = declare_type(
            self.types,
            name,
            concurrency,
            processes,
            attempts,
            delivery,
            timeout,
            priority,
            self.settings.max_payload_bytes,
        )
        jt.limits = checked_limits(global_concurrency, rate, burst, limit_by)
        jt.sequence = checked_sequence(sequence_by, on_failure, cron)
        jt.max_rss_mb = checked_max_rss(max_rss_mb)
        check_pool(self.types, name, pool, processes, jt.max_rss_mb)
        jt.pool = pool
        jt.fair = checked_fair(fair_by, fair_weights)
        if cron is not None:
            check_cron(cron, tz)
        if unique_for is not None:
            jt.unique = checked_unique(unique_for, unique_by, unique_states, on_duplicate)
        if unique is not None:
            jt.unique, jt.debounce = unique_policies(unique, jt.unique, unique_states, on_duplicate)
        if callback:
            jt.callback, jt.callback_timeout_s = True, check_callback_timeout(callback_timeout)
        jt.retention_s = check_retention(retention)

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
        schedule = new_schedule(
            self.types, self.schedules, job_type, cron, payload, name, tz, catch_up, priority
        )
        self.schedules[schedule.name] = schedule

    def on_process_start(self, fn: Callable[[], object]) -> Callable[[], object]:
        """Decorator: `fn()` runs in each process `hivejobs run` forks (pools, coordinator),
        first thing after the fork, before it takes any work. What must not cross a fork
        goes here: e.g. an OpenTelemetry exporter's connections and threads
        (docs/howto/opentelemetry.md). An exception in it crashes that process (restarted
        with backoff), so a broken setup is loud."""
        self.process_start_hooks.append(fn)
        return fn

    def job_type(self, name: str) -> JobType:
        """A registered type, or one a running worker fleet declared in Postgres (CLI use)."""
        jt = self.types.get(name)
        if jt is not None:
            return jt
        remote = self._declared_types()
        info = remote.get(name)
        if info is None:
            raise UnknownJobType(name, sorted(set(self.types) | set(remote)))
        # The payload schema its worker declared: checked here as the worker would.
        codec = self._remote_schemas.codec(self.store, name, self.settings.max_payload_bytes)
        return declared_type(info, codec)

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

    def _postgres_errors(self) -> contextlib.AbstractContextManager[None]:
        return self.connections.postgres_errors()

    # -- connections (Connections owns them) -------------------------------------------

    def resolve_backends(self) -> None:
        """Without configured URLs, pick the local servers or start embedded ones (once).

        Called on first connection, so importing an app never starts servers."""
        self.connections.resolve()

    @property
    def embedded(self) -> EmbeddedServers | None:
        """The embedded servers the backend choice started for this app, if it did."""
        return self.connections.embedded

    @property
    def store(self) -> Store:
        return self.connections.store

    @property
    def read_store(self) -> Store:
        """The store listings and dashboards read from: HIVEJOBS_READ_DATABASE_URL (e.g. a
        replica, which may lag) when set, else the primary's."""
        return self.connections.read_store

    @property
    def pusher(self) -> Pusher:
        return self.connections.pusher

    @property
    def broker(self) -> Broker:
        return self.connections.broker

    def migrate(self) -> list[str]:
        """Create the database if missing and apply pending migrations (idempotent)."""
        return self.connections.migrate()

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait until the ids of jobs enqueued so far were pushed to Redis."""
        return self.connections.flush(timeout_s)

    def close(self) -> None:
        self.connections.close()

    # -- enqueue -----------------------------------------------------------------------

    def enqueue(
        self,
        name: str,
        payload: object = None,
        *,
        id: str | None = None,
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
        job = jt.new_job(payload, id, priority, delay, run_at, expires_at)
        raw = driver_connection(conn) if conn is not None else None
        own = raw is None or owns_transaction(raw)
        with self._postgres_errors(), tracing.enqueueing(job) as job:
            # On an error the job is not acknowledged; if the connection died during COMMIT
            # it may be stored: enqueue again with the same id to be sure (idempotent).
            inserted = self.store.insert_job(job, id is not None, raw)
        job_id, created = jt.outcome(job, inserted)
        if created and own:
            failpoint("enqueue.after_commit_before_push")
            self.pusher.submit(job.name, inserted.priority, [job_id])
        return job_id

    async def aenqueue(
        self,
        name: str,
        payload: object = None,
        *,
        id: str | None = None,
        priority: int | None = None,
        delay: float | None = None,
        run_at: datetime | None = None,
        expires_at: datetime | None = None,
        conn: object | None = None,
    ) -> str:
        """`enqueue` for event loops; `conn` is a psycopg `AsyncConnection` or a SQLAlchemy
        `AsyncConnection` / `AsyncSession`, with the same transaction rules."""
        jt = await self._ajob_type(name)
        job = jt.new_job(payload, id, priority, delay, run_at, expires_at)
        raw = await adriver_connection(conn) if conn is not None else None
        own = raw is None or owns_transaction(raw)
        backends = await self.async_backends()
        with self._postgres_errors(), tracing.enqueueing(job) as job:
            inserted = await backends.store.insert_job(job, id is not None, raw)
        job_id, created = jt.outcome(job, inserted)
        if created and own:
            failpoint("enqueue.after_commit_before_push")
            await self._apush(backends, [Push(job_id, job.name, inserted.priority)])
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
        jobs = jt.new_jobs(payloads, priority, delay, expires_at)
        if not jobs:
            return []
        raw = driver_connection(conn) if conn is not None else None
        with self._postgres_errors(), tracing.enqueueing_many(jobs) as jobs:
            pushes = self.store.insert_many(jobs, raw)
        if pushes and jt.fair is not None:
            self._place_fair(jt.fair, name, jobs, pushes)
        elif pushes:
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
        jobs = jt.new_jobs(payloads, priority, delay, expires_at)
        if not jobs:
            return []
        raw = await adriver_connection(conn) if conn is not None else None
        backends = await self.async_backends()
        with self._postgres_errors(), tracing.enqueueing_many(jobs) as jobs:
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

    def _place_fair(
        self, fair: FairBy, name: str, jobs: Sequence[NewJob], pushes: Sequence[Push]
    ) -> None:
        """A fair type's new jobs straight into their keys' lists (broker/fair.py): the keys
        are in hand here, so no pool has to read them back from Postgres. A Redis error is
        handled as a failed push: the reconciler dispatches the jobs."""
        keys = {j.id: fair.key_of(j.payload) for j in jobs}
        try:
            place(self.broker, name, [(i, p, keys[i]) for i, _, p in pushes])
        except redis.RedisError as exc:
            logger.warning(
                "job stored but push to Redis failed; the coordinator will dispatch it",
                job_type=name,
                jobs=len(pushes),
                **error_fields(exc),
            )

    def _push(self, name: str, priority: int, ids: Sequence[str]) -> None:
        try:
            self.broker.push(name, priority, ids)
        except redis.RedisError as exc:
            # PG is the truth: the job is stored; the reconciler pushes it later (rule R1 in
            # docs/concepts/reliability.md: ack after the commit, Redis only carries hints).
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
        return await self.connections.async_backends()

    async def aclose(self) -> None:
        """Close this event loop's async connections (from the web app's shutdown hook)."""
        await self.connections.aclose()

    # -- reads and user actions --------------------------------------------------------

    def get_job(self, job_id: str) -> JobInfo:
        check_id(job_id)
        return _job_info(job_id, self.store.get_row(job_id))

    async def aget_job(self, job_id: str) -> JobInfo:
        check_id(job_id)
        backends = await self.async_backends()
        with self._postgres_errors():
            return _job_info(job_id, await backends.store.get_row(job_id))

    def cancel(self, job_id: str) -> bool:
        """Cancel a waiting job now, or tell a running one to stop (it ends `cancelled`
        unless it succeeds first). False when the job has already finished."""
        check_id(job_id)
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
        if error is not None and "\x00" in error:
            raise InvalidArgument("error must not contain NUL characters (\\u0000)")
        delay = jt.backoff.delay_s(attempt) if status == "failed" and retryable else None
        text = (
            error if error is not None else (None if status == "succeeded" else "callback: failed")
        )
        if text is not None:
            text = storable_text(text, self.settings.max_result_bytes)
        result = CallbackStore(self.store).complete(name, job_id, attempt, status, delay, text)
        if result.outcome is None:
            if result.state is None:
                raise JobNotFound(job_id)
            raise CallbackRefused(
                f"job {job_id!r} is {result.state} at attempt {result.attempt}: a callback for "
                f"attempt {attempt} is refused (only a running job's current attempt takes one)"
            )
        record_callback(self.broker, name, result.outcome)
        return result

    # -- waiting (the logic is in waiting.py) ---------------------------------------------

    def wait(
        self,
        job_id: str,
        timeout: float | None = None,
        *,
        on_progress: Callable[[JobEvent], object] | None = None,
    ) -> JobInfo:
        """Block until the job finishes and return it (state, attempt, error, result).
        Woken by a Postgres NOTIFY when it is archived, not by polling. Raises WaitTimeout
        after `timeout` seconds (None: no limit), JobNotFound for an unknown id.
        `on_progress`: called with each progress report and partial result (JobEvent) as
        the job sends them, the last stored progress first (see `stream`)."""
        check_id(job_id)
        if on_progress is not None:
            return streaming.wait_with_progress(self, job_id, timeout, on_progress)
        return waiting.wait(self, job_id, timeout)

    async def await_job(
        self,
        job_id: str,
        timeout: float | None = None,
        *,
        on_progress: Callable[[JobEvent], object] | None = None,
    ) -> JobInfo:
        """`wait` for event loops: `info = await app.await_job(job_id, timeout=30)`;
        `on_progress` may be a coroutine function."""
        check_id(job_id)
        if on_progress is not None:
            return await streaming.await_with_progress(self, job_id, timeout, on_progress)
        return await waiting.await_job(self, job_id, timeout)

    # -- streamed events (the logic is in streaming.py) ------------------------------------

    def stream(self, job_id: str, timeout: float | None = None) -> Iterator[JobEvent]:
        """The job's events until it ends: its last stored progress first (a late reader
        sees where it got to), then each progress and partial result as the job sends them
        (ctx.progress, ctx.emit), then one `kind="end"` event with its final state. Raises
        WaitTimeout after `timeout` seconds (None: no limit), JobNotFound for an unknown
        id. Close the iterator (or leave the loop) to stop early."""
        check_id(job_id)
        return streaming.stream(self, job_id, timeout)

    def astream(self, job_id: str, timeout: float | None = None) -> AsyncIterator[JobEvent]:
        """`stream` for event loops: `async for event in app.astream(job_id): ...`."""
        check_id(job_id)
        return streaming.astream(self, job_id, timeout)

    def progress(self, job_id: str) -> JobEvent | None:
        """The job's last stored progress (at most a second behind the live one while it
        runs, its last when it ended), None if it reported none."""
        check_id(job_id)
        from hivejobs.store.progress import get_progress

        return get_progress(self.store, job_id)

    # -- flow control (the logic is in flow.py) -------------------------------------------

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

    def flow(self, name: str) -> TypeFlow:
        """Job type `name`'s flow state: paused or not (since when), and the runner threads
        per pool process its pools use (`scale`'s, else the code's `concurrency`)."""
        concurrency = self.job_type(name).concurrency  # UnknownJobType first
        settings = type_settings(self.store, name)
        return TypeFlow(
            name=name,
            paused=settings.paused,
            paused_at=settings.paused_at,
            concurrency=concurrency,
            scaled_concurrency=settings.concurrency,
        )

    def fair_keys(self, name: str, limit: int = 100) -> list[KeyCount]:
        """The keys of fair type `name` with live jobs (queued, running, scheduled), busiest
        first; InvalidArgument for a type without fair_by. Reads the type's live rows: for a
        person asking, not for a loop."""
        jt = self.job_type(name)  # UnknownJobType first
        if jt.fair is None:
            raise InvalidArgument(f"job type {name!r} has no fair_by: it has no keys to show")
        return FairStore(self.read_store, name, jt.fair.field).key_counts(limit)

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
        from hivejobs.client.listing import replay_options

        plan = replay_options(info, datetime.now(UTC))
        new_id = self.enqueue(
            info.name,
            info.payload,
            priority=plan.priority,
            delay=plan.delay_s,
            expires_at=plan.expires_at,
        )
        logger.info("job replayed", job_id=job_id, new_id=new_id, changes=plan.changes)
        self._replay_in_sequence(info.name, job_id, new_id)
        return Replayed(
            id=new_id,
            priority=plan.priority,
            delay_s=plan.delay_s,
            expires_at=plan.expires_at,
            changes=plan.changes,
        )

    def _replay_in_sequence(self, name: str, job_id: str, new_id: str) -> None:
        """The replay of the job that holds its key takes that job's place: it runs first,
        then the key goes on. The key stays held until then: nothing of it starts between."""
        jt = self.types.get(name)
        if jt is None or jt.sequence is None:
            return
        new = self.store.get_row(new_id)
        key = None if new is None else jt.sequence.key(name, bytes(new["payload"]))
        if key is not None and SequenceStore(self.store).hold_of(name, key) == job_id:
            SequenceStore(self.store).take_hold_place(name, key, job_id, new_id)
            logger.info("replay takes the held job's turn", job_id=job_id, new_id=new_id)

    def _sequenced(self, name: str) -> None:
        if self.job_type(name).sequence is None:  # UnknownJobType first
            raise InvalidArgument(f"job type {name!r} has no sequence_by: it has no keys")

    def keys(self, name: str, limit: int = 1000) -> list[KeyState]:
        """A sequenced type's keys with live jobs or a hold (held first): queued, scheduled
        and running counts, the job whose turn it is, and the hold with its error."""
        self._sequenced(name)
        return SequenceStore(self.store).keys(name, limit)

    def release_key(self, name: str, key: str) -> str | None:
        """Let a held key go on past its failed job (which stays failed); returns that job's
        id, or None when the key was not held. `key` is the field's JSON text ('"acme"')."""
        self._sequenced(name)
        released = SequenceStore(self.store).release(name, key)
        if released is not None:
            logger.info("sequence key released", job_type=name, held_by=released)
        return released

    def list_jobs(
        self,
        state: str | Sequence[str] | None = None,
        type: str | None = None,  # the job type, as the CLI's --type
        since: datetime | timedelta | None = None,
        until: datetime | None = None,
        limit: int = 100,
        after: str | None = None,
    ) -> JobPage:
        """Live and archived jobs, newest first (by finished_at, or created_at while live),
        filtered by state(s), job type and time; `since` is a moment or a span back from
        now (judged on the database clock). Keyset-paginated: pass the page's `next` as
        `after`. A job that finishes while you page may appear on two pages."""
        from hivejobs.client.listing import list_jobs

        return list_jobs(self.store, state, type, since, until, limit, after)

    # -- chains (hivejobs.client.chains's ChainClient does the work) --------------------------

    def _chains(self) -> ChainClient:
        """Made per call over the current store: `close()` may have replaced it."""
        return ChainClient(
            self.store,
            lambda: self.broker,
            self.job_type,
            read_store=self.read_store,
            stop_timeout_s=self.settings.chain_stop_timeout_s,
            wake_over_redis=self.settings.pgbouncer and not self.settings.listen_database_url,
        )

    def run_chain(self, chain: Chain, conn: object | None = None) -> str:
        """Validate and store a chain (ChainInvalid stores nothing); returns its request id.
        `conn`: in the caller's transaction, with the rules of `enqueue`."""
        return self._chains().run(chain, conn)

    async def arun_chain(self, chain: Chain, conn: object | None = None) -> str:
        """`run_chain` for event loops: `conn` is an async connection, or None."""
        chains = await asyncio.to_thread(self._chains)  # may open the store
        ready = await asyncio.to_thread(chains.prepare, chain)  # may read declared types
        raw = await adriver_connection(conn) if conn is not None else None
        backends = await self.async_backends()
        with tracing.submitting_chain(ready.head) as head:
            await backends.store.create_chain(head, ready.jobs, ready.sequences, raw)
        logger.info(
            "chain stored", chain_id=ready.request_id, chain=chain.name, jobs=len(ready.jobs)
        )
        return ready.request_id

    def chain_status(self, request_id: str) -> ChainStatus:
        return self._chains().status(request_id)

    def stop_chain(self, request_id: str, timeout: float | None = None, wait: bool = False) -> bool:
        """Stop a live chain; False when it had already finished. It ends `stopped`, or
        `failed` when one of its jobs had failed for good. Tries that ignore ctx.stopping
        are abandoned after `timeout` seconds (default `chain_stop_timeout_s`, 30) and the
        job log says so. `wait`: return once every try has ended (or was abandoned)."""
        return self._chains().stop(request_id, timeout, wait)

    def job_log(self, request_id: str) -> list[JobLogEntry]:
        """One entry per try of every job of the chain, in the order they finished."""
        return self._chains().job_log(request_id)

    def list_chains(
        self,
        limit: int = 50,
        *,
        state: str | Sequence[str] | None = None,
        type: str | None = None,  # the chain's name, spincycle's request type
        job_type: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        before: tuple[datetime, str] | None = None,
    ) -> list[ChainSummary]:
        """Chains newest first, filtered by state(s), type (the chain's name), job type and
        creation time; `before` = (created_at, id) of the last chain of a previous page."""
        query = chain_query(state, type, job_type, since, until, before, limit)
        return self._chains().list_chains(query)

    def chain_ps(self, limit: int = 500) -> list[RunningTry]:
        """What runs now across the fleet (spincycle's `ps`): each live chain try with its
        host, pid, status text and age."""
        return self._chains().running_tries(limit)

    # -- batches (hivejobs.client.batches does the work) -----------------------------------

    def batch(
        self,
        *,
        on_complete: str | None = None,
        on_success: str | None = None,
        data: object = None,
        priority: int = 0,
        conn: object | None = None,
    ) -> Batch:
        """Store a batch and return its handle: `with app.batch(on_complete="report") as b:
        b.enqueue(...)`. Once sealed (leaving the block, or `b.seal()`) and every job of it
        has ended, job `on_complete` runs once with a BatchDone payload (counts, failed ids,
        `data`); `on_success` too when every job succeeded. `conn`: in the caller's
        transaction, with the rules of `enqueue`. docs/howto/batches.md."""
        params = batch_params(self, on_complete, on_success, data, priority)
        return create_batch(self, params, conn)

    async def abatch(
        self,
        *,
        on_complete: str | None = None,
        on_success: str | None = None,
        data: object = None,
        priority: int = 0,
        conn: object | None = None,
    ) -> AsyncBatch:
        """`batch` for event loops: `async with await app.abatch(...) as b:`."""
        params = await asyncio.to_thread(
            batch_params, self, on_complete, on_success, data, priority
        )  # may read declared types
        return await acreate_batch(self, params, conn)

    def batch_status(self, batch_id: str, failures: int = 1000) -> BatchStatus:
        """A batch's state, counters and its first `failures` failed members (by id);
        BatchNotFound if unknown."""
        return batch_status(self, batch_id, failures)

    def job_batch(self, job_id: str) -> Batch | None:
        """The batch of a live job, as a handle its own run may add to (JobContext.batch)."""
        return job_batch(self, job_id)


def _job_info(job_id: str, row: dict[str, Any] | None) -> JobInfo:
    if row is None:
        raise JobNotFound(job_id)
    row["payload"] = decode_json(bytes(row["payload"]), row["name"])
    row["result"] = decode_json(bytes(row["result"]) if row["result"] else None, row["name"])
    return JobInfo(**row)


def load_app(spec: str) -> App:
    """Import MODULE:ATTR (the current directory is importable, as for a Procfile)."""
    module_name, _, attr = spec.partition(":")
    if not module_name:
        raise UsageError(f"expected MODULE:APP, got {spec!r}")
    if module_name.endswith(".py") or "/" in module_name or os.sep in module_name:
        dotted = module_name.removesuffix(".py").lstrip("./").replace(os.sep, ".")
        raise UsageError(
            f"{spec!r} is a file path; give MODULE:APP, the module's import path and the"
            f" App's name, e.g. {dotted.replace('/', '.')}:{attr or 'app'}"
        )
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(f"cannot import {module_name!r}: {exc}") from None
    name = attr or "app"
    apps = sorted(k for k, v in vars(module).items() if isinstance(v, App))
    found = f"its Apps: {', '.join(apps)}" if apps else "it defines no App"
    if not hasattr(module, name):
        raise UsageError(f"module {module_name!r} has no attribute {name!r} ({found})")
    app = getattr(module, name)
    if not isinstance(app, App):
        raise UsageError(
            f"{module_name}:{name} is a {type(app).__name__}, not a hivejobs App ({found})"
        )
    return app
