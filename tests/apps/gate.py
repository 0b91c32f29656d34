"""A gate the test opens: handlers block on it instead of working a fixed duration.

A fixed duration races the test on a loaded machine (the jobs may end before the test gets
to its fault); a gate holds them until the test says so, however slow anything else is.
The gate is a Redis list under the instance's key prefix; the test opens it by pushing one
element, and every waiter passes it on with BLMOVE to the same list (an atomic rotation),
so one push releases all current and later waiters, and it stays open. `await_gate` is the
wait of an `async def` handler: on the event loop, no thread, and a stop reaches it as the
cancellation of its task.
"""

from __future__ import annotations

import os
import threading
import time
from functools import cache

import redis
import redis.asyncio

from hivejobs.broker import Broker


def gate_key(prefix: str, name: str) -> str:
    return f"{prefix}gate:{name}"


@cache
def _client() -> redis.Redis:
    return redis.Redis.from_url(os.environ["HIVEJOBS_REDIS_URL"])


def wait_at_gate(name: str, stopping: threading.Event | None = None, timeout: float = 60) -> bool:
    """Block until the test opens gate `name` (True) or `stopping` is set (False); a gate
    never opened within `timeout` s raises, so a forgotten open fails loudly."""
    key = gate_key(os.environ["HIVEJOBS_PREFIX"], name)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if stopping is not None and stopping.is_set():
            return False
        # Short blocking waits when `stopping` must be watched too; else at most 1 s, well
        # under redis-py's socket timeout (5 s by default), which a longer blocking call would
        # outlast on a slow machine (a TimeoutError failing the handler's attempt).
        remaining = max(deadline - time.monotonic(), 0.01)
        wait = 0.1 if stopping is not None else min(remaining, 1.0)
        if _client().blmove(key, key, wait, "RIGHT", "LEFT") is not None:  # type: ignore[arg-type]
            return True
    raise TimeoutError(f"gate {name!r} not opened within {timeout} s")


async def await_gate(name: str, timeout: float = 60) -> None:
    """wait_at_gate() for an `async def` handler: awaits the gate on a connection of its own
    (a blocking BLMOVE awaited, the loop free meanwhile)."""
    key = gate_key(os.environ["HIVEJOBS_PREFIX"], name)
    client = redis.asyncio.Redis.from_url(os.environ["HIVEJOBS_REDIS_URL"])
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            # At most 1 s a call, under redis-py's socket timeout (see wait_at_gate).
            wait = min(max(deadline - time.monotonic(), 0.01), 1.0)
            if await client.blmove(key, key, wait, "RIGHT", "LEFT") is not None:  # type: ignore[arg-type]
                return
    finally:
        await client.aclose()
    raise TimeoutError(f"gate {name!r} not opened within {timeout} s")


def open_gate(broker: Broker, name: str) -> None:
    """Release every handler waiting at gate `name` under `broker`'s prefix, now and later."""
    broker.redis.rpush(gate_key(broker.prefix, name), "open")
