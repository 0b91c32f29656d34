"""The app of the operator-command process tests (jobs and chains):
`hivejobs run tests.apps.controlapp:app`.

Chain job types (stop timeout, job log output, data from further up) and plain ones (Fail,
replay, restart of one pool, listings). Handlers write ledger lines as the other test apps
do: `start <job id> <attempt> <pid>` and `end <job id> <attempt> <outcome> <pid>`.
`coop` and `stubborn` hold at the test's gate `gate` (tests/apps/gate.py) when the payload
names one, instead of working `s` seconds. `planned` ends each attempt as its payload's plan
says (Retry, an error, Fail or a result); HJ_ASYNC=1 registers it and `final` with `async def`
handlers, and `planned` notes the kind it ran as: `start <job id> <attempt> <pid> <ns> <kind>`.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import Any

import msgspec

from hivejobs import App, Backoff, Fail, Interrupted, JobContext, NotAnAncestor, Retry
from tests.apps.gate import wait_at_gate
from tests.apps.ledger import handler_kind, note

app = App()
ASYNC = os.environ.get("HJ_ASYNC") == "1"


class DeployArgs(msgspec.Struct):
    """Chain args as a Struct: validated at run_chain, read back with ctx.chain.args_as."""

    env: str
    replicas: int


def start(ctx: JobContext) -> None:
    note("start", ctx.job_id, ctx.attempt, os.getpid())


def end(ctx: JobContext, outcome: str) -> None:
    note("end", ctx.job_id, ctx.attempt, outcome, os.getpid())


@app.job("step", concurrency=4)
def step(ctx: JobContext, payload: dict[str, Any]) -> dict[str, Any]:
    start(ctx)
    end(ctx, "ok")
    info = ctx.chain
    return {"key": info.key if info else None, "n": payload.get("n", 0)}


@app.job("coop", concurrency=4)
def coop(ctx: JobContext, payload: dict[str, Any]) -> str:
    """Works `s` seconds (or until gate `gate` opens) with a status line; stops when told
    (ctx.stopping)."""
    start(ctx)
    if "gate" in payload:
        ctx.set_status("working: waiting at the gate")
        if not wait_at_gate(str(payload["gate"]), ctx.stopping):
            end(ctx, "interrupted")
            raise Interrupted()
        end(ctx, "ok")
        return "done"
    began = time.monotonic()
    while time.monotonic() - began < float(payload.get("s", 30)):
        ctx.set_status(f"working {time.monotonic() - began:.0f}s")
        if ctx.stopping.wait(0.1):
            end(ctx, "interrupted")
            raise Interrupted()
    end(ctx, "ok")
    return "done"


@app.job("stubborn", concurrency=2)
def stubborn(ctx: JobContext, payload: dict[str, Any]) -> str:
    """Ignores ctx.stopping for `s` seconds, or until gate `gate` opens (the stop timeout's
    reason to exist)."""
    start(ctx)
    ctx.set_status("not listening")
    if "gate" in payload:
        wait_at_gate(str(payload["gate"]))  # without ctx.stopping: deaf on purpose
    else:
        time.sleep(float(payload.get("s", 30)))
    end(ctx, "ok")
    return "finished anyway"


@app.job("broken", concurrency=2)
def broken(ctx: JobContext, payload: dict[str, Any]) -> None:
    start(ctx)
    end(ctx, "error")
    raise RuntimeError("broken on purpose")


@app.job("printer", concurrency=2)
def printer(ctx: JobContext, payload: dict[str, Any]) -> str:
    """Prints `lines` numbered lines to stdout and one to stderr; fails its first try."""
    start(ctx)
    info = ctx.chain
    assert info is not None
    for i in range(int(payload.get("lines", 3))):
        print(f"out line {i} of try {info.try_number}")
    print(f"err line of try {info.try_number}", file=sys.stderr)
    if info.try_number == 1:
        end(ctx, "error")
        raise ValueError("printer fails its first try")
    end(ctx, "ok")
    return "printed"


@app.job("reader", concurrency=2)
def reader(ctx: JobContext, payload: dict[str, Any]) -> dict[str, Any]:
    """Reads results from further up, the chain's Struct args, and a non-ancestor."""
    start(ctx)
    info = ctx.chain
    assert info is not None
    args = info.args_as(DeployArgs)
    try:
        info.result_of(payload["not_ancestor"])
        refused = ""
    except NotAnAncestor as exc:
        refused = str(exc)
    end(ctx, "ok")
    return {
        "grandparent": info.result_of(payload["grandparent"]),
        "env": args.env,
        "replicas": args.replicas,
        "refused": refused,
    }


def final(ctx: JobContext, payload: dict[str, Any]) -> None:
    """Fails for good on its first attempt although it has five (rickover's retryable)."""
    start(ctx)
    end(ctx, "fail")
    raise Fail(f"card declined: {payload.get('card', '?')}")


async def afinal(ctx: JobContext, payload: dict[str, Any]) -> None:
    await asyncio.sleep(0)
    final(ctx, payload)


app.job("final", concurrency=2, attempts=5)(afinal if ASYNC else final)


def planned(ctx: JobContext, payload: dict[str, Any]) -> str:
    """Ends attempt n as payload["plan"][n - 1] says: "retry:S" (Retry S s later), "raise"
    (a ValueError), "fail" (Fail) or "ok" (a result)."""
    note("start", ctx.job_id, ctx.attempt, os.getpid(), time.monotonic_ns(), handler_kind())
    action = str(payload["plan"][ctx.attempt - 1])
    end(ctx, action)
    if action.startswith("retry:"):
        raise Retry(delay=float(action.split(":")[1]), reason="not yet")
    if action == "raise":
        raise ValueError(f"raised on attempt {ctx.attempt}")
    if action == "fail":
        raise Fail(f"given up on attempt {ctx.attempt}")
    return f"ok on attempt {ctx.attempt}"


async def aplanned(ctx: JobContext, payload: dict[str, Any]) -> str:
    await asyncio.sleep(0.01)
    return planned(ctx, payload)


app.job("planned", concurrency=4, attempts=3, backoff=Backoff(base_s=0.1))(
    aplanned if ASYNC else planned
)


@app.job("quick", concurrency=2, retention=float(os.environ.get("HJ_RETENTION_QUICK", 0)) or None)
def quick(ctx: JobContext, payload: dict[str, Any]) -> str:
    start(ctx)
    end(ctx, "ok")
    return "ok"


# HJ_TYPES=a,b runs only those pools: fewer processes on a busy test machine.
_SELECTED = set(filter(None, os.environ.get("HJ_TYPES", "").split(",")))
for _name in list(app.types):
    if _SELECTED and _name not in _SELECTED:
        del app.types[_name]
