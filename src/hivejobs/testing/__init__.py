"""hivejobs.testing: run your own handlers in tests exactly as the pool runs them.

Three ways, from cheapest to closest to production:

- `run_job(app, name, payload)`: no servers. The payload makes the encode/decode round trip
  a real enqueue makes (a payload the worker could not decode fails here too), the handler
  gets a real JobContext, and the outcome is what the pool would write.
- `inline(app)`: inside the block, `app.enqueue` stores the job and runs it in this process
  before returning, as Celery's eager mode or Sidekiq's `Testing.inline!` do.
- `drain(app)`: runs every queued job in this process against the real database: claim,
  execute and finish through the statements and the executor the pool uses.

The pytest plugin (hivejobs.testing.plugin) gives each test its own migrated database and
Redis prefix. Nothing here is used by `hivejobs run`; it never speaks to a live worker.

Layer: the top (with web, bench, dev): may import client, worker and everything below;
the runtime never imports it.
"""

from __future__ import annotations

import contextlib
import os
import socket
import uuid
from collections.abc import Iterator, Sequence
from typing import Literal

import msgspec

from hivejobs.client.app import App, JobContext
from hivejobs.errors import DrainIncomplete, UnknownJobType
from hivejobs.jobtypes import JobType
from hivejobs.records.jobs import PRIORITIES, ClaimedJob, Completion, Outcome
from hivejobs.serialization import decode_json
from hivejobs.store import new_worker_id
from hivejobs.worker.executor import execute

__all__ = ["DrainResult", "JobRun", "drain", "inline", "run_job"]

Promote = Literal["due", "retries", "all"]
BATCH = 100


class JobRun(msgspec.Struct, frozen=True, kw_only=True):
    """How one attempt ended: `outcome` is what the pool would write (a `retry` is a failed
    attempt with attempts left); `result` is the handler's return value after its JSON round
    trip; `error` the traceback or reason."""

    job_id: str
    outcome: Outcome
    result: object = None
    error: str | None = None
    retry_delay_s: float = 0.0


class DrainResult(msgspec.Struct, kw_only=True):
    """What one drain ran, counted by the outcome of each attempt."""

    succeeded: int = 0
    failed: int = 0
    retried: int = 0
    cancelled: int = 0
    suspended: int = 0
    awaiting_callback: int = 0  # `callback=True` types: handed over, waiting for the service
    runs: list[JobRun] = msgspec.field(default_factory=list)

    @property
    def ran(self) -> int:
        return len(self.runs)


def _job_type(app: App, name: str) -> JobType:
    jt = app.types.get(name)
    if jt is None:
        raise UnknownJobType(name, sorted(app.types))
    return jt


def _run(app: App, jt: JobType, job: ClaimedJob) -> JobRun:
    ctx = JobContext(job, app)
    completion = execute(jt, job, ctx, max_result_bytes=app.settings.max_result_bytes)
    return _job_run(completion)


def _job_run(c: Completion) -> JobRun:
    result = decode_json(c.result) if c.result is not None else None
    return JobRun(
        job_id=c.id, outcome=c.outcome, result=result, error=c.error, retry_delay_s=c.retry_delay_s
    )


def run_job(
    app: App,
    name: str,
    payload: object = None,
    *,
    attempt: int = 1,
    attempts: int | None = None,
    job_id: str | None = None,
) -> JobRun:
    """Run one attempt of job type `name` in this process, without Postgres or Redis.

    Raises PayloadInvalid as `enqueue` would; never raises what the handler raises (that is
    the attempt's outcome, as in the pool). `attempt`/`attempts` let a test see the last
    attempt (`failed`) rather than a `retry`. A handler that reads `ctx.chain` or
    `ctx.upstream` needs the database (use drain for chain jobs)."""
    jt = _job_type(app, name)
    job = ClaimedJob(
        id=job_id or str(uuid.uuid4()),
        name=name,
        attempt=attempt,
        attempts=attempts if attempts is not None else jt.attempts,
        delivery=jt.delivery,
        payload=jt.codec.encode(payload),
        claim_token=0,
        priority=jt.priority,
    )
    return _run(app, jt, job)


class _Drainer:
    """One in-process worker for drain and inline: owns a worker row (registered, so a
    coordinator running meanwhile never takes its claims for a dead worker's) and writes each
    completion at once, through Store.finish as the completer does."""

    def __init__(self, app: App) -> None:
        self.app = app
        self.store = app.connections.store
        self.worker_id = new_worker_id()
        host = socket.gethostname()
        self.store.register_worker(self.worker_id, host, os.getpid(), "pool", "testing")

    def close(self) -> None:
        self.store.deregister_worker(self.worker_id)

    def run_ids(self, name: str, ids: Sequence[str]) -> list[JobRun]:
        jt = _job_type(self.app, name)
        with self.store.connection() as conn:
            jobs = self.store.claim_queued(list(ids), self.worker_id, conn, name=name)
        runs = []
        for job in jobs:
            ctx = JobContext(job, self.app)
            completion = execute(jt, job, ctx, max_result_bytes=self.app.settings.max_result_bytes)
            with self.store.connection() as conn:
                self.store.finish([completion], conn)
            runs.append(_job_run(completion))
        return runs

    def queued(self, names: set[str]) -> list[tuple[str, list[str]]]:
        """Queued ids per type, highest priority (lowest number) first, from Postgres."""
        counts = self.store.queued_counts()
        found = []
        for prio in PRIORITIES:
            for name in sorted(n for n, p in counts if p == prio and n in names):
                rows = self.store.queued_page((name, prio), None, BATCH)
                found.append((name, [r[0] for r in rows]))
        return found


def drain(
    app: App,
    *,
    types: Sequence[str] | None = None,
    promote: Promote = "due",
    max_jobs: int = 10_000,
) -> DrainResult:
    """Run what is queued, in this process, until nothing is left; return what ran.

    Jobs a job enqueues are run too. `promote` decides what of `scheduled` runs now: "due"
    (what a coordinator would queue now), "retries" (also retries waiting out their backoff,
    so a failing job runs all its attempts), "all" (also jobs enqueued with a delay). Only
    `types` (default: every type registered here). Raises DrainIncomplete after
    `max_jobs` attempts with work left (a job that enqueues itself forever). Chains are not
    traversed: that is the coordinator's work. A paused type's jobs are left queued; fleet-wide
    limits (global_concurrency, rate, limit_by) do not apply: jobs run one at a time, here."""
    app.flush()
    names = set(types) if types is not None else set(app.types)
    for name in names:
        _job_type(app, name)
    drainer = _Drainer(app)
    result = DrainResult()
    try:
        while True:
            if promote != "due":
                drainer.store.advance_scheduled_if_testing(every=promote == "all")
            while len(drainer.store.promote_due_unleased(BATCH)) == BATCH:
                pass
            # A paused type's jobs stay queued, as under a worker (and a paused type whose
            # ids claim nothing would otherwise be drained for ever). Looked at every round:
            # a job may pause a type. No limit (global_concurrency, rate) applies here.
            batches = drainer.queued(names - set(app.paused()))
            if not batches:
                return result
            for name, ids in batches:
                if result.ran >= max_jobs:
                    raise DrainIncomplete(max_jobs)
                for run in drainer.run_ids(name, ids[: max_jobs - result.ran]):
                    _count(result, run)
    finally:
        drainer.close()


def _count(result: DrainResult, run: JobRun) -> None:
    result.runs.append(run)
    if run.outcome == "succeeded":
        result.succeeded += 1
    elif run.outcome == "failed":
        result.failed += 1
    elif run.outcome == "retry":
        result.retried += 1
    elif run.outcome == "cancelled":
        result.cancelled += 1
    elif run.outcome == "await_callback":
        result.awaiting_callback += 1
    else:
        result.suspended += 1


@contextlib.contextmanager
def inline(app: App) -> Iterator[App]:
    """Inside the block, `app.enqueue` stores the job and runs it at once in this process
    (through drain's claim and finish), then returns its id; look at the outcome with
    `app.get_job(id)`. A job enqueued with a delay, or inside the caller's transaction
    (`conn=`), is only stored: run it with `drain` (after the commit). A retry waits for its
    backoff as in production: `drain(app, promote="retries")` runs the remaining attempts."""
    drainer = _Drainer(app)
    try:
        with app.inline_mode(drainer.run_ids):
            yield app
    finally:
        drainer.close()
