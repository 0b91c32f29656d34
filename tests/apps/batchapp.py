"""The app of the batch process tests: `hivejobs run tests.apps.batchapp:app`.

`bwork` works (sleeps `ms`, waits at gate `gate`, fails with `fail`, adds `spawn` jobs to
its own batch); `breport` and `bsuccess` are the callbacks. Every handler writes ledger
lines (tests/apps/ledger.py), so a callback's runs are counted even across kill -9.
HJ_ASYNC=1 registers all three with `async def` handlers; `start` and `report` lines end with
the kind the handler ran as.
"""

from __future__ import annotations

import asyncio
import os
import time

import msgspec

from hivejobs import App, Backoff, BatchDone, JobContext
from tests.apps.gate import await_gate, wait_at_gate
from tests.apps.ledger import handler_kind, note

app = App()
ASYNC = os.environ.get("HJ_ASYNC") == "1"


class Work(msgspec.Struct):
    ms: float = 5.0
    gate: str | None = None
    fail: bool = False
    spawn: int = 0


def bwork(ctx: JobContext, payload: Work) -> None:
    note("start", ctx.job_id, ctx.attempt, os.getpid(), handler_kind())
    if payload.gate is not None:
        wait_at_gate(payload.gate)
    else:
        time.sleep(payload.ms / 1000)
    worked(ctx, payload)


async def abwork(ctx: JobContext, payload: Work) -> None:
    note("start", ctx.job_id, ctx.attempt, os.getpid(), handler_kind())
    if payload.gate is not None:
        await await_gate(payload.gate)
    else:
        await asyncio.sleep(payload.ms / 1000)
    worked(ctx, payload)


def worked(ctx: JobContext, payload: Work) -> None:
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
    note(
        "report",
        done.batch_id,
        done.event,
        done.total,
        done.succeeded,
        done.failed,
        failed,
        handler_kind(),
    )


async def areport(ctx: JobContext, done: BatchDone) -> None:
    await asyncio.sleep(0)
    report(ctx, done)


backoff = Backoff(base_s=0.1)
app.job("bwork", concurrency=8, processes=2, attempts=3, backoff=backoff)(
    abwork if ASYNC else bwork
)
app.job("breport", concurrency=2)(areport if ASYNC else report)
app.job("bsuccess", concurrency=2)(areport if ASYNC else report)
