"""The app of the stored-secrets test: every handler puts the process's database URL (with
its password) into something hivejobs stores: an error, a traceback, a result, a chain status,
captured stdout and stderr."""

from __future__ import annotations

import sys
from typing import Any

from hivejobs import App, Backoff, JobContext

app = App()


def dsn(ctx: JobContext) -> str:
    return ctx.app.settings.database_url


@app.job("raises", attempts=2, backoff=Backoff(base_s=0.05, max_s=0.1))
def raises(ctx: JobContext, payload: dict[str, Any]) -> None:
    raise RuntimeError(f"cannot connect to {dsn(ctx)}")


@app.job("returns")
def returns(ctx: JobContext, payload: dict[str, Any]) -> dict[str, Any]:
    return {"dsn": dsn(ctx), dsn(ctx): [dsn(ctx)]}


@app.job("talks", attempts=1)
def talks(ctx: JobContext, payload: dict[str, Any]) -> None:
    print(f"connecting to {dsn(ctx)}")
    print(f"warning: {dsn(ctx)}", file=sys.stderr)
    ctx.set_status(f"on {dsn(ctx)}")
    raise RuntimeError(f"lost {dsn(ctx)}")
