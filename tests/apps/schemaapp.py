"""The app whose worker declares payload schemas for `hivejobs enqueue` without --app: a
typed type (its handler writes the decoded payload to $HJ_LEDGER/resize.<job id>) and an
untyped one."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Literal

import msgspec

from hivejobs import App, JobContext

app = App()


class Resize(msgspec.Struct):
    url: str
    width: Annotated[int, msgspec.Meta(gt=0)]
    mode: Literal["fit", "fill"] = "fit"


@app.job("resize", concurrency=2)
def resize(ctx: JobContext, payload: Resize) -> None:
    folder = Path(os.environ["HJ_LEDGER"])
    (folder / f"resize.{ctx.job_id}").write_text(f"{payload.url} {payload.width} {payload.mode}")


@app.job("note", concurrency=1)
def note(ctx: JobContext, payload: object) -> None:
    """Takes any JSON."""
