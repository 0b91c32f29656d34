"""The app of the async-native pool tests: `hivejobs run tests.apps.asyncapp:app`.

Every handler is `async def` and writes ledger lines (tests/apps/ledger.py, they survive
kill -9): "abegin <id> <attempt> <pid> <ns>" when it starts, "aend <id> <attempt> <pid> <ns>"
when it ends (ns: CLOCK_MONOTONIC, one clock for every process of the machine), "acancelled
<id> <attempt> <pid>" when a stop reached it as cancellation. A payload
{"gate": NAME} waits at the test's gate (tests/apps/gate.py's Redis key) without a thread:
one poller task per gate and process, every waiter awaits its event, so 500 waiters cost no
thread; {"ms": MS} awaits asyncio.sleep for MS ms. {"block_s": S} holds the event loop for
S seconds (a blocking call in an `async def` handler, the mistake the pool reports).
HJ_TYPES selects the job types to register (default: all), HJ_CONCURRENCY_<TYPE> overrides
a type's concurrency.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from typing import Any

import redis.asyncio

from hivejobs import App, JobContext
from tests.apps.gate import gate_key
from tests.apps.ledger import note

app = App()
SELECTED = set(filter(None, os.environ.get("HJ_TYPES", "").split(",")))
_gates: dict[str, asyncio.Event] = {}
_pollers: set[asyncio.Task[None]] = set()


async def _poll(name: str, opened: asyncio.Event) -> None:
    client = redis.asyncio.Redis.from_url(os.environ["HIVEJOBS_REDIS_URL"])
    key = gate_key(os.environ["HIVEJOBS_PREFIX"], name)
    try:
        while not await client.exists(key):
            await asyncio.sleep(0.05)  # a test helper's poll of the gate, off the job's path
        opened.set()
    finally:
        await client.aclose()


async def at_gate(name: str) -> None:
    opened = _gates.get(name)
    if opened is None:
        opened = _gates[name] = asyncio.Event()
        poller = asyncio.get_running_loop().create_task(_poll(name, opened))
        _pollers.add(poller)
        poller.add_done_callback(_pollers.discard)
    await opened.wait()


async def gated(ctx: JobContext, payload: dict[str, Any]) -> str:
    note("abegin", ctx.job_id, ctx.attempt, os.getpid(), time.monotonic_ns())
    try:
        if "gate" in payload:
            await at_gate(str(payload["gate"]))
        if "block_s" in payload:
            time.sleep(float(payload["block_s"]))  # holds the loop, on purpose
        await asyncio.sleep(float(payload.get("ms", 0)) / 1000)
    except asyncio.CancelledError:
        note("acancelled", ctx.job_id, ctx.attempt, os.getpid())
        raise
    note("aend", ctx.job_id, ctx.attempt, os.getpid(), time.monotonic_ns())
    return "done"


async def blocks_the_loop(ctx: JobContext, payload: dict[str, Any]) -> str:
    """Its own function, so that the report names this one."""
    note("abegin", ctx.job_id, ctx.attempt, os.getpid(), time.monotonic_ns())
    time.sleep(float(payload["block_s"]))  # holds the loop, on purpose
    note("aend", ctx.job_id, ctx.attempt, os.getpid(), time.monotonic_ns())
    return "done"


def register(name: str, handler: Callable[..., Any], concurrency: int, **options: Any) -> None:
    if SELECTED and name not in SELECTED:
        return
    concurrency = int(os.environ.get("HJ_CONCURRENCY_" + name.upper(), concurrency))
    app.job(name, concurrency=concurrency, **options)(handler)


register("wide", gated, 500)
register("alo_async", gated, 8, attempts=5)
register("amo_async", gated, 8, delivery="at_most_once")
register("blocker", blocks_the_loop, 4)
register("limited_async", gated, 8, global_concurrency=2)  # fleet-wide: 2 at once
register("rated_async", gated, 8, rate="5/s", burst=1)
