"""The app of the async-native pool tests: `hivejobs run tests.apps.asyncapp:app`.

Every handler is `async def` and writes ledger lines (tests/apps/ledger.py, they survive
kill -9): "abegin <id> <attempt> <pid> <ns>" when it starts, "aend <id> <attempt> <pid> <ns>"
when it ends (ns: CLOCK_MONOTONIC, one clock for every process of the machine), "acancelled
<id> <attempt> <pid>" when a stop reached it as cancellation. A payload
{"gate": NAME} waits at the test's gate (tests/apps/gate.py's Redis key) without a thread:
one poller task per gate and process, every waiter awaits its event, so 500 waiters cost no
thread. {"block_s": S} holds the event loop for S seconds (a blocking call in an `async
def` handler, the mistake the pool reports).
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import redis.asyncio

from hivejobs import App, JobContext
from tests.apps.gate import gate_key
from tests.apps.ledger import note

app = App()
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
        await asyncio.sleep(0)
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


app.job("wide", concurrency=500)(gated)
app.job("alo_async", concurrency=8, attempts=5)(gated)
app.job("amo_async", concurrency=8, delivery="at_most_once")(gated)
app.job("blocker", concurrency=4)(blocks_the_loop)
