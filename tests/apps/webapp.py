"""The app that the web tests serve and run: `hivejobs serve|run tests.apps.webapp:app`.

echo: typed payload (a wrong field type is a 422); boom: always fails with a traceback;
hold: runs until cancelled or `HJ_HOLD_S` passes; remote: a callback type (rickover) whose
handler records the attempt it handed over in $HJ_LEDGER/handed.<job id>, a line
"<attempt> <job type> <def|async>"; HJ_AREMOTE=1 adds `aremote`, its `async def` twin.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import msgspec

from hivejobs import App, Backoff, Interrupted, JobContext
from tests.apps.ledger import handler_kind

app = App()


class Echo(msgspec.Struct):
    text: str
    n: int = 0


@app.job("echo", concurrency=4, attempts=3)
def echo(ctx: JobContext, payload: Echo) -> dict[str, object]:
    time.sleep(payload.n / 1000)
    return {"echo": payload.text}


@app.job("boom", concurrency=2, attempts=2, backoff=Backoff(base_s=0.05, max_s=0.1))
def boom(ctx: JobContext, payload: dict[str, Any]) -> None:
    raise RuntimeError("boom: the handler failed on purpose")


@app.job("hold", concurrency=2, attempts=1)
def hold(ctx: JobContext, payload: dict[str, Any]) -> None:
    if ctx.stopping.wait(float(os.environ.get("HJ_HOLD_S", "30"))):
        raise Interrupted()  # cancelled (ends cancelled) or shutting down (suspended)


def remote(ctx: JobContext, payload: dict[str, Any]) -> None:
    folder = os.environ.get("HJ_LEDGER")
    if folder:
        path = Path(folder) / f"handed.{ctx.job_id}"
        with open(path, "a") as fh:
            fh.write(f"{ctx.attempt} {ctx.name} {handler_kind()}\n")


async def aremote(ctx: JobContext, payload: dict[str, Any]) -> None:
    await asyncio.sleep(0)
    remote(ctx, payload)


CALLBACK_TYPE: dict[str, Any] = {
    "concurrency": 2,
    "attempts": 3,
    "callback": True,
    "callback_timeout": float(os.environ.get("HJ_CALLBACK_TIMEOUT_S", "60")),
    "backoff": Backoff(base_s=0.05, max_s=0.1),
}
app.job("remote", **CALLBACK_TYPE)(remote)
if os.environ.get("HJ_AREMOTE") == "1":
    app.job("aremote", **CALLBACK_TYPE)(aremote)
