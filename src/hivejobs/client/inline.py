"""`App(testing="inline")`: enqueue runs the job at once in the caller, with no Postgres and no
Redis, as Celery's eager mode and Sidekiq's `Testing.inline!` do.

The payload makes the encode/decode round trip a real enqueue makes (bad input raises as
`enqueue` does), the handler gets a real JobContext, and every attempt runs through the
executor the pool uses. What differs from production, on purpose, because nothing is stored:
retries run at once (no backoff wait), `delay`/`run_at` are checked but not waited for,
`conn=` is ignored (the job runs now, not on commit), unique windows are not kept, and only
`enqueue`, `enqueue_many`, their async forms and `get_job`/`aget_job` are served (from this
process's memory). Jobs a handler enqueues run after it returns, breadth first, as `drain`
runs them. `hivejobs.testing.inline(app)` is the same idea against the real database.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import msgspec

from hivejobs.errors import (
    ConfigError,
    DrainIncomplete,
    JobIdConflict,
    JobNotFound,
    UnknownJobType,
)
from hivejobs.records import ClaimedJob, JobInfo, JobState, NewJob, Outcome
from hivejobs.serialization import decode_json
from hivejobs.worker.context import JobContext
from hivejobs.worker.executor import execute

if TYPE_CHECKING:
    from hivejobs.client.app import App
    from hivejobs.jobtypes import JobType

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


def install(app: App, mode: str) -> None:
    """Called by App(testing=...): shadow the enqueue and read methods of this one app."""
    if mode not in MODES:
        raise ConfigError(f"testing must be one of {MODES} (or None), not {mode!r}")
    runner = InlineRunner(app)
    # Instance attributes shadow the methods for this app only, as testing.inline does.
    for name in ("enqueue", "enqueue_many", "aenqueue", "aenqueue_many", "get_job", "aget_job"):
        setattr(app, name, getattr(runner, name))


class InlineRunner:
    """Runs an App's jobs in the enqueuing thread and keeps their JobInfo in memory.
    `_lock` guards `_jobs`, `_pending` and `_busy` (tests may enqueue from threads); a
    thread that finds another one draining leaves its job to that drain."""

    def __init__(self, app: App) -> None:
        self.app = app
        self._lock = threading.Lock()
        self._jobs: dict[str, JobInfo] = {}
        self._pending: deque[NewJob] = deque()
        self._busy = False

    def enqueue(
        self,
        name: str,
        payload: object = None,
        *,
        id: str | None = None,  # App.enqueue's own keyword
        priority: int | None = None,
        delay: float | None = None,
        run_at: datetime | None = None,
        expires_at: datetime | None = None,
        conn: object | None = None,
    ) -> str:
        job = self._type(name).new_job(payload, id, priority, delay, run_at, expires_at)
        return self._accept([job])[0]

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
        return self._accept(self._type(name).new_jobs(payloads, priority, delay, expires_at))

    async def aenqueue(self, name: str, payload: object = None, **options: object) -> str:
        return self.enqueue(name, payload, **options)  # type: ignore[arg-type]

    async def aenqueue_many(
        self, name: str, payloads: Iterable[object], **options: object
    ) -> list[str]:
        return self.enqueue_many(name, payloads, **options)  # type: ignore[arg-type]

    def get_job(self, job_id: str) -> JobInfo:
        with self._lock:
            info = self._jobs.get(job_id)
        if info is None:
            raise JobNotFound(job_id)
        return info

    async def aget_job(self, job_id: str) -> JobInfo:
        return self.get_job(job_id)

    def _type(self, name: str) -> JobType:
        jt = self.app.types.get(name)
        if jt is None or jt.handler is None:
            raise UnknownJobType(name, sorted(self.app.types))
        return jt

    def _accept(self, jobs: list[NewJob]) -> list[str]:
        """Record every job as queued (an id reused with another payload raises first, so
        nothing is taken), then run them unless an outer enqueue is already running jobs."""
        now = datetime.now(UTC)
        ids = []
        with self._lock:
            fresh = []
            for job in jobs:
                known = self._jobs.get(job.id)
                if known is not None:
                    if known.name != job.name or known.payload != decode_json(job.payload):
                        raise JobIdConflict(job.id)
                    ids.append(job.id)  # the same job again: its existing run stands
                    continue
                fresh.append(job)
                ids.append(job.id)
            for job in fresh:
                self._jobs[job.id] = _queued_info(job, now)
                self._pending.append(job)
            if self._busy:
                return ids
            self._busy = True
        try:
            self._drain()
        finally:
            with self._lock:
                self._busy = False
        return ids

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
            self._run(job)

    def _run(self, job: NewJob) -> None:
        """Every attempt at once until one ends the job (a retry waits for nothing here)."""
        jt = self._type(job.name)
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
                jt,
                claimed,
                JobContext(claimed, self.app),
                max_result_bytes=self.app.settings.max_result_bytes,
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
