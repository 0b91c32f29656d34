"""The app of the batch process tests: `hivejobs run tests.apps.batchapp:app`.

`bwork` works (sleeps `ms`, waits at gate `gate`, fails with `fail`, adds `spawn` jobs to
its own batch); `breport` and `bsuccess` are the callbacks. Every handler writes ledger
lines (tests/apps/ledger.py), so a callback's runs are counted even across kill -9.
"""

from __future__ import annotations

import os
import time

import msgspec

from hivejobs import App, Backoff, BatchDone, JobContext
from tests.apps.gate import wait_at_gate
from tests.apps.ledger import note

app = App()


class Work(msgspec.Struct):
    ms: float = 5.0
    gate: str | None = None
    fail: bool = False
    spawn: int = 0


@app.job("bwork", concurrency=8, processes=2, attempts=3, backoff=Backoff(base_s=0.1))
def bwork(ctx: JobContext, payload: Work) -> None:
    note("start", ctx.job_id, ctx.attempt, os.getpid())
    if payload.gate is not None:
        wait_at_gate(payload.gate)
    else:
        time.sleep(payload.ms / 1000)
    if payload.spawn:
        batch = ctx.batch
        if batch is None:
            raise RuntimeError("a spawning job must be a batch member")
        batch.enqueue_many("bwork", [Work()] * payload.spawn)
    if payload.fail:
        note("end", ctx.job_id, ctx.attempt, "error", os.getpid())
        raise ValueError("asked to fail")
    note("end", ctx.job_id, ctx.attempt, "ok", os.getpid())


def report(ctx: JobContext, done: BatchDone) -> None:
    failed = ",".join(done.failed_ids) or "-"
    note("report", done.batch_id, done.event, done.total, done.succeeded, done.failed, failed)


app.job("breport", concurrency=2)(report)
app.job("bsuccess", concurrency=2)(report)
