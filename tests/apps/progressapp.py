"""The app of the progress-stream tests: `hivejobs run tests.apps.progressapp:app`.

`steps` and `asteps` (its `async def` twin) report progress and emit a partial result after
each step; a payload {"gate": NAME} holds step i at the test's gate "NAME:i"
(tests/apps/gate.py) instead of running it at once, so a test sees each step's report
while the job runs. `bounds` breaks one bound on purpose (payload {"field": ...}); `chatty`
emits and reports far beyond the rates and returns how many emits were let through.
"""

from __future__ import annotations

import asyncio
from typing import Any

from hivejobs import App, JobContext
from tests.apps.gate import wait_at_gate

app = App()


@app.job("steps", concurrency=4, attempts=1)
def steps(ctx: JobContext, payload: dict[str, Any]) -> dict[str, int]:
    n = int(payload["n"])
    for i in range(n):
        if "gate" in payload:
            wait_at_gate(f"{payload['gate']}:{i}")
        ctx.progress(i + 1, n, note=f"step {i + 1}")
        ctx.emit({"step": i + 1})
    return {"steps": n}


@app.job("asteps", concurrency=4, attempts=1)
async def asteps(ctx: JobContext, payload: dict[str, Any]) -> dict[str, int]:
    n = int(payload["n"])
    for i in range(n):
        if "gate" in payload:
            await asyncio.to_thread(wait_at_gate, f"{payload['gate']}:{i}")
        ctx.progress(i + 1, n, note=f"step {i + 1}")
        ctx.emit({"step": i + 1})
    return {"steps": n}


@app.job("bounds", concurrency=2, attempts=1)
def bounds(ctx: JobContext, payload: dict[str, Any]) -> None:
    field = payload["field"]
    if field == "note":
        ctx.progress(1, 2, note="x" * 501)
    elif field == "partial_result":
        ctx.emit({"blob": "x" * 70_000})
    elif field == "done":
        ctx.progress(3, 2)
    else:
        ctx.progress(float("nan"), 2)


@app.job("chatty", concurrency=2, attempts=1)
def chatty(ctx: JobContext, payload: dict[str, Any]) -> dict[str, int]:
    n = int(payload["n"])
    accepted = sum(ctx.emit({"i": i}) for i in range(n))
    for i in range(n):
        ctx.progress(i + 1, n)
    return {"accepted": accepted}
