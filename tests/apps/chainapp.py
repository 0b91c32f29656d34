"""The app that chain process tests run with `hivejobs run tests.apps.chainapp:app`.

Handlers append ledger lines to $HJ_LEDGER/ledger.<pid> (O_APPEND, one write per line):
`start <job id> <attempt> <pid> <monotonic ns>` and `end <job id> <attempt> <outcome> <pid>
<monotonic ns>`. A chain try has its own job id, so "one start per id" means "no try started
twice", and end -> start gaps between a job and its successor are the hop latency.
"""

from __future__ import annotations

import os
import time
from typing import Any

from hivejobs import App, Interrupted, JobContext
from tests.apps.gate import wait_at_gate
from tests.apps.ledger import note

app = App()
CONCURRENCY = int(os.environ.get("HJ_CHAIN_CONCURRENCY", "8"))


def start(ctx: JobContext) -> None:
    note("start", ctx.job_id, ctx.attempt, os.getpid(), time.monotonic_ns())


def end(ctx: JobContext, outcome: str) -> None:
    note("end", ctx.job_id, ctx.attempt, outcome, os.getpid(), time.monotonic_ns())


@app.job("step", concurrency=CONCURRENCY)
def step(ctx: JobContext, payload: dict[str, Any]) -> dict[str, Any]:
    """Sleeps `ms`; returns its key and `n` for the merge job to add up."""
    start(ctx)
    time.sleep(payload.get("ms", 0) / 1000)
    info = ctx.chain
    end(ctx, "ok")
    return {"key": info.key if info else None, "n": payload.get("n", 0)}


@app.job("merge", concurrency=2)
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


@app.job("flaky", concurrency=4)
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


@app.job("long", concurrency=CONCURRENCY)
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
