"""The app that chain process tests run with `hivejobs run tests.apps.chainapp:app`.

Handlers append ledger lines to $HJ_LEDGER/ledger.<pid> (O_APPEND, one write per line):
`start <job id> <attempt> <pid> <monotonic ns> <def|async>` and
`end <job id> <attempt> <outcome> <pid> <monotonic ns>`. A chain try has its own job id, so
"one start per id" means "no try started twice", and end -> start gaps between a job and its
successor are the hop latency.
HJ_ASYNC=1 registers `step`, `merge`, `flaky` and `long` with their `async def` twins (the same
ledger lines and results; waits awaited on the loop, a stop seen as cancellation).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from typing import Any, TypeVar

from hivejobs import App, Interrupted, JobContext
from tests.apps.gate import await_gate, wait_at_gate
from tests.apps.ledger import handler_kind, note

app = App()
CONCURRENCY = int(os.environ.get("HJ_CHAIN_CONCURRENCY", "8"))
ASYNC = os.environ.get("HJ_ASYNC") == "1"
F = TypeVar("F", bound=Callable[..., Any])


def job(name: str, twin: Callable[..., Any] | None = None, **options: Any) -> Callable[[F], F]:
    """app.job(name) for the decorated `def` handler, or for its `async def` twin under
    HJ_ASYNC=1."""

    def wrap(fn: F) -> F:
        app.job(name, **options)(twin if ASYNC and twin is not None else fn)
        return fn

    return wrap


def start(ctx: JobContext) -> None:
    note("start", ctx.job_id, ctx.attempt, os.getpid(), time.monotonic_ns(), handler_kind())


def end(ctx: JobContext, outcome: str) -> None:
    note("end", ctx.job_id, ctx.attempt, outcome, os.getpid(), time.monotonic_ns())


def stepped(ctx: JobContext, payload: dict[str, Any]) -> dict[str, Any]:
    info = ctx.chain
    end(ctx, "ok")
    return {"key": info.key if info else None, "n": payload.get("n", 0)}


async def astep(ctx: JobContext, payload: dict[str, Any]) -> dict[str, Any]:
    start(ctx)
    await asyncio.sleep(payload.get("ms", 0) / 1000)
    return stepped(ctx, payload)


@job("step", twin=astep, concurrency=CONCURRENCY)
def step(ctx: JobContext, payload: dict[str, Any]) -> dict[str, Any]:
    """Sleeps `ms`; returns its key and `n` for the merge job to add up."""
    start(ctx)
    time.sleep(payload.get("ms", 0) / 1000)
    return stepped(ctx, payload)


async def amerge(ctx: JobContext, payload: dict[str, Any]) -> dict[str, Any]:
    return merge(ctx, payload)


@job("merge", twin=amerge, concurrency=2)
def merge(ctx: JobContext, payload: dict[str, Any]) -> dict[str, Any]:
    """Reads every predecessor's result: fails unless all of them are there."""
    start(ctx)
    up = ctx.upstream
    missing = [k for k, v in up.items() if not isinstance(v, dict) or v.get("key") != k]
    if len(up) != payload["expect"] or missing:
        end(ctx, "error")
        raise ValueError(f"upstream has {len(up)} results, missing {missing[:5]}")
    end(ctx, "ok")
    return {"count": len(up), "sum": sum(int(v["n"]) for v in up.values() if isinstance(v, dict))}


async def aflaky(ctx: JobContext, payload: dict[str, Any]) -> str:
    return flaky(ctx, payload)


@job("flaky", twin=aflaky, concurrency=4)
def flaky(ctx: JobContext, payload: dict[str, Any]) -> str:
    """Fails while its total try number is <= `fail_until` (counted across sequence tries)."""
    start(ctx)
    info = ctx.chain
    assert info is not None
    if info.try_number <= payload.get("fail_until", 0):
        end(ctx, "error")
        raise RuntimeError(f"flaky failure on try {info.try_number}")
    end(ctx, "ok")
    return f"ok on try {info.try_number}"


async def along(ctx: JobContext, payload: dict[str, Any]) -> str:
    """long() as an `async def` handler: a stop reaches it as the cancellation of its task."""
    start(ctx)
    try:
        if "gate" in payload:
            ctx.set_status("waiting at the gate")
            await await_gate(payload["gate"])
        else:
            total = float(payload.get("s", 20))
            began = time.monotonic()
            while (elapsed := time.monotonic() - began) < total:
                ctx.set_status(f"{int(100 * elapsed / total)}% done")
                await asyncio.sleep(0.1)
    except asyncio.CancelledError:
        end(ctx, "interrupted")
        raise
    end(ctx, "ok")
    return "done"


@job("long", twin=along, concurrency=CONCURRENCY)
def long(ctx: JobContext, payload: dict[str, Any]) -> str:
    """Works `s` seconds, reporting progress, or until the test opens gate `gate` if the
    payload names one; stops cooperatively when told."""
    start(ctx)
    if "gate" in payload:
        ctx.set_status("waiting at the gate")
        if not wait_at_gate(payload["gate"], ctx.stopping):
            end(ctx, "interrupted")
            raise Interrupted()
        end(ctx, "ok")
        return "done"
    total = float(payload.get("s", 20))
    began = time.monotonic()
    while (elapsed := time.monotonic() - began) < total:
        ctx.set_status(f"{int(100 * elapsed / total)}% done")
        if ctx.stopping.wait(0.1):
            end(ctx, "interrupted")
            raise Interrupted()
    end(ctx, "ok")
    return "done"


@app.job("fanout", concurrency=2)
def fanout(ctx: JobContext, payload: dict[str, Any]) -> dict[str, Any]:
    """Adds `n` fanleaf jobs below itself in `parts` adds (one transaction each), the last
    with a merge job `join` after all of them that the jobs named in `before` wait for too.
    Notes `added <job id> <part> <jobs added> <pid> <ns the add took>` after each add. On its
    first try with a `gate`, waits there after the first add: where a test kills its pool."""
    start(ctx)
    info = ctx.chain
    assert info is not None
    n, parts = int(payload["n"]), int(payload.get("parts", 1))
    size = -(-n // parts)
    for part in range(parts if n else 0):  # n = 0: adds nothing (the jobs were declared)
        more = info.grow()
        for i in range(part * size, min(n, (part + 1) * size)):
            more.job("fanleaf", {"n": i, "root": payload.get("root")})
        if part == parts - 1:
            leaves = [f"{info.key}.{i + 1}" for i in range(n)]
            more.job(
                "merge", {"expect": n}, name="join", after=leaves, before=payload.get("before", [])
            )
        began = time.monotonic_ns()
        added = info.add(more)
        note("added", ctx.job_id, part, len(added), os.getpid(), time.monotonic_ns() - began)
        if part == 0 and "gate" in payload and info.try_number == 1:
            wait_at_gate(payload["gate"])
    end(ctx, "ok")
    return {"key": info.key, "n": 0}


@app.job("fanleaf", concurrency=CONCURRENCY)
def fanleaf(ctx: JobContext, payload: dict[str, Any]) -> dict[str, Any]:
    """One added job: returns its key and `n`, and the result of the chain job `root` names
    (an ancestor further up than its parent), read with ctx.chain.result_of."""
    start(ctx)
    info = ctx.chain
    assert info is not None
    root = info.result_of(payload["root"]) if payload.get("root") else None
    end(ctx, "ok")
    return {"key": info.key, "n": payload["n"], "root": root}
