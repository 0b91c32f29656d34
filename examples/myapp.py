"""The example app the README walks through: `hivejobs run examples.myapp:app`."""

from __future__ import annotations

import time

import msgspec

from hivejobs import App, JobContext, Retry

app = App()


class Resize(msgspec.Struct):
    url: str
    width: int


@app.job("resize", concurrency=8, attempts=5, timeout=60.0)
def resize(ctx: JobContext, payload: Resize) -> dict[str, object]:
    """Pretend to resize an image; the return value is kept as the job's result."""
    time.sleep(0.01)
    return {"url": payload.url, "width": payload.width, "attempt": ctx.attempt}


@app.job("email", concurrency=4, delivery="at_most_once")
def send_email(ctx: JobContext, payload: dict[str, str]) -> None:
    """At most once: a crash mid-send fails the job rather than sending twice."""
    if "@" not in payload.get("to", ""):
        raise ValueError("no @ in the address: nothing sent")  # failed, with its traceback
    ctx.logger.info("sending email", to_domain=payload.get("to", "").split("@")[-1])


@app.job("flaky", attempts=3)
def flaky(ctx: JobContext, payload: dict[str, int]) -> str:
    """Fails its first attempt, then succeeds: shows retries with a chosen delay."""
    if ctx.attempt == 1:
        raise Retry(delay=0.5)
    return f"ok on attempt {ctx.attempt}"
