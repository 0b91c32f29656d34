"""A failed attempt's traceback starts at the handler: the worker's frames above it are one
line, frames the handler called into (ours included) stay."""

from __future__ import annotations

from typing import Any

import pytest

from hivejobs import App, Chain, JobContext
from hivejobs.testing import run_job

app = App()


def _parse(address: str) -> None:
    if "@" not in address:
        raise ValueError("no @ in the address")


@app.job("mail")
def mail(ctx: JobContext, payload: dict[str, Any]) -> None:
    _parse(payload["to"])


@app.job("amail")
async def amail(ctx: JobContext, payload: dict[str, Any]) -> None:
    _parse(payload["to"])


@app.job("calls_us")
def calls_us(ctx: JobContext, payload: dict[str, Any]) -> None:
    Chain.from_json(b"{")


@pytest.mark.parametrize("job_type", ["mail", "amail"])
def test_the_traceback_starts_at_the_handler(job_type: str) -> None:
    error = run_job(app, job_type, {"to": "x"}).error or ""
    lines = error.splitlines()
    assert lines[0] == "Traceback (most recent call last):"
    assert lines[1].startswith("  [") and "frames of the worker calling the handler" in lines[1]
    assert __file__ in lines[2] and f"in {job_type}" in lines[2]
    assert "hivejobs/worker" not in error
    assert lines[-1] == "ValueError: no @ in the address"


def test_our_frames_below_the_handler_stay() -> None:
    error = run_job(app, "calls_us", {}).error or ""
    assert __file__ in error.splitlines()[2]
    assert "hivejobs/chains/builder.py" in error  # what the handler called
    assert error.strip().splitlines()[-1].startswith("hivejobs.errors.ChainInvalid: ")
