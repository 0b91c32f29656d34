"""An app made for tests with `App(testing="inline")`: `hivejobs run` must refuse it."""

from __future__ import annotations

from hivejobs import App, JobContext

app = App(testing="inline")


@app.job("double")
def double(ctx: JobContext, payload: int) -> int:
    return payload * 2
