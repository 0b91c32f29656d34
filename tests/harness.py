"""The test suite's harness: the helpers of real processes live in bench/harness.py, shared
with the chaos scenarios, and are re-exported here; what only tests use is defined here.

Cross-process waits poll a condition with a deadline (wait_until); never a fixed sleep.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Any

from bench.harness import (
    FAST_SETTINGS,
    REDIS_URL,
    ROOT,
    Instance,
    PostgresServer,
    RedisServer,
    alive,
    db_url,
    free_port,
    ledger_oks,
    ledger_starts,
    live_jobs,
    pg_admin_url,
    pool_pids,
    read_ledger,
    running_in_pid,
    sql,
    wait_until,
    worker_processes,
)

from hivejobs import App

__all__ = [
    "fleet_app",
    "HANDLER_KINDS",
    "handler_env",
    "of_kind",
    "ROOT",
    "REDIS_URL",
    "FAST_SETTINGS",
    "wait_until",
    "pg_admin_url",
    "db_url",
    "sql",
    "live_jobs",
    "read_ledger",
    "ledger_starts",
    "ledger_oks",
    "running_in_pid",
    "Instance",
    "pool_pids",
    "alive",
    "worker_processes",
    "free_port",
    "RedisServer",
    "PostgresServer",
]


def fleet_app(make_app: Callable[..., App], url: str, types: list[str], **kw: object) -> App:
    """An App that enqueues through the types the running fleet declared in Postgres, once
    the fleet's pools for `types` are up."""
    wait_until(lambda: all(pool_pids(url, t) for t in types), what=f"pools {types}")
    app = make_app(**kw)
    app.types.clear()
    return app


# The two kinds of handler whose semantics must be the same: a test of a behaviour that
# depends on how a handler runs is parametrised over both (the test apps read HJ_ASYNC).
HANDLER_KINDS = ("def", "async")


def handler_env(kind: str) -> dict[str, str]:
    """The test apps' environment for handlers of `kind` ("def" or "async")."""
    return {"HJ_ASYNC": "1"} if kind == "async" else {}


def of_kind(kind: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A decorator for in-process tests: the `def` handler itself, or for "async" an `async
    def` handler that yields to its loop once and then runs the same body (with the same
    annotations: the payload's type)."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        if kind == "def":
            return fn

        @functools.wraps(fn)  # its name, and its annotations resolved in its own module
        async def twin(ctx: Any, payload: Any) -> Any:
            await asyncio.sleep(0)
            return fn(ctx, payload)

        return twin

    return wrap
