"""The app of the flow-control process tests: `hivejobs run tests.apps.flowapp:app`.

Each handler writes "begin <id> <pid> <monotonic ns>" and "end <id> <pid> <monotonic ns>" to
the ledger (tests/apps/ledger.py: O_APPEND lines that survive kill -9): the independent
record of when handlers ran, from which the tests count how many ran at once. The clock is
CLOCK_MONOTONIC, one clock for every process on the machine. A payload {"gate": NAME} holds a
handler at the test's gate (tests/apps/gate.py) instead of its `ms` or `s`.
HJ_GLOBAL sets `limited`'s global_concurrency, HJ_RATE and HJ_BURST `rated`'s rate;
HJ_LIMIT_BY=1 registers `per_customer` (2 running per payload "customer"); HJ_RATE_BY (a
rate, "5/s") registers `rated_customer`: 2 running and that rate per customer, burst 2.
HJ_ASYNC=1 registers `per_customer`, `rated_customer` and `hog` with `async def` handlers
(the same lines, the kind last: "begin <id> <pid> <ns> <def|async>").
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from typing import Any

from hivejobs import App, Fail, JobContext
from tests.apps.gate import await_gate, wait_at_gate
from tests.apps.ledger import handler_kind, note

app = App()
ASYNC = os.environ.get("HJ_ASYNC") == "1"


def _timed(ctx: JobContext, payload: dict[str, Any]) -> object:
    note("begin", ctx.job_id, os.getpid(), time.monotonic_ns(), handler_kind())
    if "gate" in payload:
        wait_at_gate(str(payload["gate"]))
    else:
        time.sleep(float(payload.get("ms", 50)) / 1000)
    return _timed_end(ctx, payload)


def _timed_end(ctx: JobContext, payload: dict[str, Any]) -> object:
    note("end", ctx.job_id, os.getpid(), time.monotonic_ns())
    if payload.get("fail"):
        raise Fail("asked to fail")
    return payload.get("echo")


async def _atimed(ctx: JobContext, payload: dict[str, Any]) -> object:
    """_timed() as an `async def` handler: the waits awaited on the pool's loop."""
    note("begin", ctx.job_id, os.getpid(), time.monotonic_ns(), handler_kind())
    if "gate" in payload:
        await await_gate(str(payload["gate"]))
    else:
        await asyncio.sleep(float(payload.get("ms", 50)) / 1000)
    return _timed_end(ctx, payload)


app.job("limited", concurrency=8, global_concurrency=int(os.environ.get("HJ_GLOBAL", "3")))(_timed)
app.job(
    "rated",
    concurrency=8,
    rate=os.environ.get("HJ_RATE", "10/s"),
    burst=int(os.environ.get("HJ_BURST", "2")),
)(_timed)
app.job("plain", concurrency=4)(_timed)
if os.environ.get("HJ_LIMIT_BY"):  # only where a test runs it: one pool process fewer elsewhere
    app.job("per_customer", concurrency=8, global_concurrency=2, limit_by="customer")(
        _atimed if ASYNC else _timed
    )
if rate_by := os.environ.get("HJ_RATE_BY"):
    app.job(
        "rated_customer",
        concurrency=8,
        global_concurrency=2,
        rate=rate_by,
        burst=2,
        limit_by="customer",
    )(_atimed if ASYNC else _timed)


async def _awaits(ctx: JobContext, payload: dict[str, Any]) -> str:
    """An async handler: begin/end lines with the thread it ran on (the loop's), and a
    "cancelled" line when a stop reached it as asyncio cancellation."""
    note("abegin", ctx.job_id, os.getpid(), time.monotonic_ns(), threading.get_ident())
    try:
        if "gate" in payload:
            # The gate's blocking wait in a thread, which gives up once ctx.stopping is set
            # (so no thread outlives the stop); the stop itself arrives as cancellation,
            # which the runner sends when ctx.stopping is set: wait for it here.
            if not await asyncio.to_thread(wait_at_gate, str(payload["gate"]), ctx.stopping):
                await asyncio.Event().wait()
        else:
            await asyncio.sleep(float(payload.get("s", 0.4)))
    except asyncio.CancelledError:
        note("cancelled", ctx.job_id, os.getpid(), ctx.attempt)
        raise
    note("aend", ctx.job_id, os.getpid(), time.monotonic_ns(), threading.get_ident())
    return "awaited"


app.job("aio", concurrency=8)(_awaits)
app.job("aio_timeout", concurrency=2, attempts=1, timeout=1.0)(_awaits)


HOARD: list[bytes] = []  # what `hog` jobs leak, on purpose, until the pool is recycled


def _hog(ctx: JobContext, payload: dict[str, float]) -> None:
    note("begin", ctx.job_id, os.getpid(), time.monotonic_ns(), handler_kind())
    HOARD.append(b"\x01" * (int(payload.get("mb", 40)) << 20))  # touched: resident
    time.sleep(0.3)  # the pool looks at its memory once a second: let it look between jobs
    note("end", ctx.job_id, os.getpid(), time.monotonic_ns())


async def _ahog(ctx: JobContext, payload: dict[str, float]) -> None:
    note("begin", ctx.job_id, os.getpid(), time.monotonic_ns(), handler_kind())
    HOARD.append(b"\x01" * (int(payload.get("mb", 40)) << 20))  # touched: resident
    await asyncio.sleep(0.3)  # as _hog's sleep, awaited
    note("end", ctx.job_id, os.getpid(), time.monotonic_ns())


app.job("hog", concurrency=1, max_rss_mb=float(os.environ.get("HJ_MAX_RSS", "250")))(
    _ahog if ASYNC else _hog
)
