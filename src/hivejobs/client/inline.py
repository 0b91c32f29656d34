"""`App(testing="inline")`: enqueue runs the job at once in the caller, with no Postgres and no
Redis, as Celery's eager mode and Sidekiq's `Testing.inline!` do.

The payload makes the encode/decode round trip a real enqueue makes (bad input raises as
`enqueue` does), the handler gets a real JobContext, and every attempt runs through the
executor the pool uses. What differs from production, on purpose, because nothing is stored:
retries run at once (no backoff wait), `delay`/`run_at` are checked but not waited for,
`conn=` is ignored (the job runs now, not on commit), unique windows are not kept, and only
`enqueue`, `enqueue_many`, their async forms and `get_job`/`aget_job` are served (from this
process's memory). Jobs a handler enqueues run after it returns, breadth first, as `drain`
runs them.

`hivejobs.testing.inline(app)` is the same runner over the App's real database (`Stored`):
`enqueue` stores and pushes each job as in production, and a job stored outside the caller's
transaction is then run once through `Stored.run` (hivejobs.testing's claim, execute and
finish); a delay or a retry's backoff is kept, and everything but `enqueue` is the App's own.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, NamedTuple

import msgspec

from hivejobs.client.enqueue import Into, Side
from hivejobs.errors import (
    ConfigError,
    DrainIncomplete,
    JobIdConflict,
    JobNotFound,
    UnknownJobType,
)
from hivejobs.records.dispatch import Push
from hivejobs.records.jobs import ClaimedJob, Inserted, JobInfo, JobState, NewJob, Outcome
from hivejobs.serialization import decode_json
from hivejobs.worker.executor import execute

if TYPE_CHECKING:
    from hivejobs.client.core import Core
    from hivejobs.jobtypes import JobType, JobTypeSpec
    from hivejobs.worker.context import AttemptContext

MODES = ("inline",)
MAX_JOBS = 10_000  # per outermost enqueue: a job that enqueues itself forever stops here
_STATES: dict[Outcome, JobState] = {
    "succeeded": "succeeded",
    "failed": "failed",
    "cancelled": "cancelled",
    "await_callback": "running",  # handed to the other service: complete_callback needs PG
    "suspend": "queued",
    "retry": "scheduled",
}


class Stored(NamedTuple):
    """The inline runner over a real database: `core` stores, pushes and reads jobs (the
    App's servers); `run(name, ids)` claims those ids that are queued and runs one attempt of
    each, writing its completion (hivejobs.testing's in-process worker)."""

    core: Core
    run: Callable[[str, Sequence[str]], object]


def checked_mode(mode: str) -> str:
    """App(testing=...): the modes there are."""
    if mode not in MODES:
        raise ConfigError(f"testing must be one of {MODES} (or None), not {mode!r}")
    return mode


class InlineRunner:
    """Runs an App's jobs in the enqueuing thread and keeps their JobInfo in memory: the
    App's mode (client/core.py's Mode) and the one side of its enqueue pipeline, sync and
    async alike (client/enqueue.py), with nothing to push.

    `_lock` guards `_jobs`, `_pending` and `_busy` (tests may enqueue from threads); a
    thread that finds another one draining leaves its job to that drain. `context` makes
    the JobContext a handler gets (its `app` is the App, so a handler can enqueue). Given
    `stored`, jobs are kept in that database instead of `_jobs` (the module docstring)."""

    def __init__(
        self,
        types: Mapping[str, JobType],
        max_result_bytes: int,
        context: Callable[[ClaimedJob], AttemptContext],
        stored: Stored | None = None,
    ) -> None:
        self._types = types
        self._stored = stored
        self._max_result_bytes = max_result_bytes
        self._context = context
        self._lock = threading.Lock()
        self._jobs: dict[str, JobInfo] = {}
        self._pending: deque[NewJob] = deque()
        self._busy = False

    @property
    def side(self) -> InlineRunner:
        return self

    @property
    def aside(self) -> Side:
        return self if self._stored is None else self._stored.core.aside

    def get_job(self, job_id: str) -> JobInfo:
        if self._stored is not None:
            return self._stored.core.get_job(job_id)
        with self._lock:
            info = self._jobs.get(job_id)
        if info is None:
            raise JobNotFound(job_id)
        return info

    async def aget_job(self, job_id: str) -> JobInfo:
        if self._stored is not None:
            return await self._stored.core.aget_job(job_id)
        return self.get_job(job_id)

    # -- the enqueue pipeline's steps: in memory nothing is stored, nothing pushed -----------

    def job_type(self, name: str) -> JobTypeSpec:
        if self._stored is not None:
            return self._stored.core.job_type(name)
        return self._registered(name)

    def _registered(self, name: str) -> JobType:
        jt = self._types.get(name)
        if jt is None:
            raise UnknownJobType(name, sorted(self._types))
        return jt

    def errors(self) -> contextlib.AbstractContextManager[None]:
        if self._stored is not None:
            return self._stored.core.side.errors()
        return contextlib.nullcontext()

    def connection(self, conn: object) -> object:
        if self._stored is not None:
            return self._stored.core.side.connection(conn)
        return None  # the job runs now, not on the caller's commit

    def insert(self, into: Into | None, job: NewJob, explicit_id: bool, raw: Any) -> Inserted:
        if self._stored is not None:
            inserted = self._stored.core.side.insert(into, job, explicit_id, raw)
            if into is None and raw is None:  # in the caller's transaction: run after commit
                self._accept_stored(msgspec.structs.replace(job, id=inserted.id))
            return inserted
        (fresh,) = self._accept([job])
        return Inserted(job.id, job.name, "queued", job.priority, job.payload, fresh)

    def insert_many(self, into: Into | None, jobs: list[NewJob], raw: Any) -> list[Push]:
        if self._stored is not None:
            return self._stored.core.side.insert_many(into, jobs, raw)
        self._accept(jobs)
        return []

    def push_one(self, push: Push) -> None:
        if self._stored is not None:
            self._stored.core.side.push_one(push)

    def push_many(self, jt: JobTypeSpec, jobs: Sequence[NewJob], pushes: list[Push]) -> None:
        if self._stored is not None:
            self._stored.core.side.push_many(jt, jobs, pushes)

    def _accept_stored(self, job: NewJob) -> None:
        """A job stored in the database: run it unless an outer enqueue is running jobs."""
        with self._lock:
            self._pending.append(job)
            if not self._take_drain():
                return
        self._drain_then_free()

    def _accept(self, jobs: list[NewJob]) -> list[bool]:
        """Record every job as queued (an id reused with another payload raises first, so
        nothing is taken), then run them unless an outer enqueue is already running jobs.
        Returns, per job, whether it is new (the same job again: its existing run stands)."""
        now = datetime.now(UTC)
        with self._lock:
            news = []
            for job in jobs:
                known = self._jobs.get(job.id)
                if known is not None:
                    if known.name != job.name or known.payload != decode_json(job.payload):
                        raise JobIdConflict(job.id)
                news.append(known is None)
            for job, new in zip(jobs, news, strict=True):
                if new:
                    self._jobs[job.id] = _queued_info(job, now)
                    self._pending.append(job)
            if not self._take_drain():
                return news
        self._drain_then_free()
        return news

    def _take_drain(self) -> bool:
        """Whether this call runs the pending jobs (called with `_lock` held): not when an
        outer enqueue already runs them, since it picks up what was just added."""
        if self._busy:
            return False
        self._busy = True
        return True

    def _drain_then_free(self) -> None:
        try:
            self._drain()
        finally:
            with self._lock:
                self._busy = False

    def _drain(self) -> None:
        ran = 0
        while True:
            with self._lock:
                if not self._pending:
                    return
                job = self._pending.popleft()
            if ran >= MAX_JOBS:
                with self._lock:
                    self._pending.clear()
                raise DrainIncomplete(MAX_JOBS)
            ran += 1
            if self._stored is not None:
                self._stored.run(job.name, [job.id])
            else:
                self._run(job)

    def _run(self, job: NewJob) -> None:
        """Every attempt at once until one ends the job (a retry waits for nothing here)."""
        jt = self._registered(job.name)
        started = datetime.now(UTC)
        attempt = 0
        while True:
            attempt += 1
            claimed = ClaimedJob(
                id=job.id,
                name=job.name,
                attempt=attempt,
                attempts=job.attempts,
                delivery=job.delivery,
                payload=job.payload,
                claim_token=attempt,
                priority=job.priority,
            )
            completion = execute(
                jt, claimed, self._context(claimed), max_result_bytes=self._max_result_bytes
            )
            if completion.outcome != "retry" or attempt >= job.attempts:
                break
        state = _STATES[completion.outcome]
        with self._lock:
            self._jobs[job.id] = msgspec.structs.replace(
                self._jobs[job.id],
                state=state,
                attempt=attempt,
                started_at=started,
                finished_at=datetime.now(UTC) if state not in ("running", "queued") else None,
                error=completion.error,
                result=decode_json(completion.result),
            )


def _queued_info(job: NewJob, now: datetime) -> JobInfo:
    run_at = job.run_at or (now + timedelta(seconds=job.delay_s or 0.0))
    return JobInfo(
        id=job.id,
        name=job.name,
        state="queued",
        attempt=0,
        attempts=job.attempts,
        priority=job.priority,
        delivery=job.delivery,
        payload=decode_json(job.payload),
        created_at=now,
        run_at=run_at,
        started_at=None,
        finished_at=None,
        expires_at=job.expires_at,
        error=None,
        result=None,
    )
