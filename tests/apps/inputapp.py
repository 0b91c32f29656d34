"""The app that bad-input process tests run: one untyped job type (its payload is decoded as
plain JSON, so a stored payload nested too deeply reaches the decoder's depth limit)."""

from __future__ import annotations

from hivejobs import App, Backoff, JobContext

app = App()


@app.job("untyped", concurrency=2, attempts=3, backoff=Backoff(base_s=0.1, max_s=0.2))
def untyped(ctx: JobContext, payload: object) -> None:
    """Succeeds with any payload that decodes."""
