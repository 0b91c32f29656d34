"""`threaded`: a synchronous handler (the App's psycopg pool is synchronous) as an async one
that runs in a worker thread, so the event loop never waits on Postgres.

Litestar's own `sync_to_thread=True` is not used: in Litestar 2.x a handler registered on a
path that several methods share came back as an unawaited coroutine (registration wrapped
it twice). The wrapper keeps the function's signature and annotations (functools.wraps), so
the modules using it must not defer annotations (no `from __future__ import annotations`):
Litestar resolves them on the wrapper, whose globals are this module's.
"""

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


def threaded(fn: Callable[P, R]) -> Callable[P, Awaitable[R]]:
    @functools.wraps(fn)
    async def run(*args: P.args, **kwargs: P.kwargs) -> R:
        return await asyncio.to_thread(fn, *args, **kwargs)

    return run
