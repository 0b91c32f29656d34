"""The app of the shared-pool process tests: `hivejobs run tests.apps.poolapp:app`.

Three job types share pool "small" with their own concurrency and delivery: `one`
(at-least-once, 1 runner), `two` (an async handler, at-least-once, 2), `three`
(at-most-once, 3); `solo` keeps a process of its own. Each handler writes "begin <type> <id>
<pid> <monotonic ns>" and "end <type> <id> <pid> <monotonic ns> <outcome>" to the ledger
(tests/apps/ledger.py: O_APPEND lines that survive kill -9), the record from which tests
count how many ran at once. A payload {"gate": NAME} holds the handler at the test's gate
(tests/apps/gate.py) until it opens, or until the attempt is asked to stop: then it ends
Interrupted (suspended at a shutdown). HJ_MANY=N registers instead N types m0..m(N-1), in
pool HJ_MANY_POOL (none when empty): the footprint measurement's app. HJ_MAX_RSS=MB
registers instead `hog` (leaks payload["mb"] MiB per job), `one` and `two` in pool "capped"
with that max_rss_mb.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from hivejobs import App, Interrupted, JobContext
from tests.apps.gate import wait_at_gate
from tests.apps.ledger import note

app = App()


def _body(name: str, ctx: JobContext, payload: dict[str, Any]) -> None:
    note("begin", name, ctx.job_id, os.getpid(), time.monotonic_ns())
    outcome = "ok"
    try:
        if "gate" in payload and not wait_at_gate(str(payload["gate"]), ctx.stopping):
            outcome = "interrupted"
            raise Interrupted()
        if "ms" in payload:
            time.sleep(float(payload["ms"]) / 1000)
    finally:
        note("end", name, ctx.job_id, os.getpid(), time.monotonic_ns(), outcome)


def one(ctx: JobContext, payload: dict[str, Any]) -> None:
    _body("one", ctx, payload)


async def two(ctx: JobContext, payload: dict[str, Any]) -> None:
    """Async: the gate's blocking wait in a thread; a stop reaches the task as cancellation,
    and the thread sees ctx.stopping."""
    await asyncio.to_thread(_body, "two", ctx, payload)


def three(ctx: JobContext, payload: dict[str, Any]) -> None:
    _body("three", ctx, payload)


def solo(ctx: JobContext, payload: dict[str, Any]) -> None:
    _body("solo", ctx, payload)


HOARD: list[bytes] = []  # what `hog` jobs leak, on purpose, until the pool is recycled


def hog(ctx: JobContext, payload: dict[str, Any]) -> None:
    """Leaks `mb` MiB (touched: resident), then works like the others."""
    HOARD.append(b"\x01" * (int(payload.get("mb", 40)) << 20))
    _body("hog", ctx, payload)


MANY = int(os.environ.get("HJ_MANY", "0"))
if os.environ.get("HJ_MAX_RSS"):
    cap = float(os.environ["HJ_MAX_RSS"])
    app.job("hog", concurrency=1, pool="capped", max_rss_mb=cap)(hog)
    app.job("one", concurrency=1, pool="capped", max_rss_mb=cap)(one)
    app.job("two", concurrency=2, pool="capped", max_rss_mb=cap)(two)
elif MANY:
    pool = os.environ.get("HJ_MANY_POOL") or None
    for i in range(MANY):
        name = f"m{i}"

        def handler(ctx: JobContext, payload: dict[str, Any], name: str = name) -> None:
            _body(name, ctx, payload)

        app.job(name, concurrency=2, pool=pool)(handler)
else:
    app.job("one", concurrency=1, attempts=3, pool="small")(one)
    app.job("two", concurrency=2, attempts=3, pool="small")(two)
    app.job("three", concurrency=3, delivery="at_most_once", pool="small")(three)
    app.job("solo", concurrency=2)(solo)
