"""Per event loop, the async client's connections: an AsyncStore and an AsyncBroker.

`await app.aenqueue(...)` must not block the web app's event loop, so it talks to Postgres
and Redis through psycopg's and redis-py's asyncio clients. Those belong to the loop that
made them; an App used from several loops (tests, threads running their own loops) keeps
one set per loop, dropped with its loop.
"""

from __future__ import annotations

import asyncio
import weakref
from dataclasses import dataclass

from hivejobs.broker.aio import AsyncBroker
from hivejobs.config import Settings
from hivejobs.store.aio import AsyncStore


@dataclass(frozen=True)
class AsyncBackends:
    store: AsyncStore
    broker: AsyncBroker

    async def close(self) -> None:
        await self.store.close()
        await self.broker.close()


class AsyncBackendsByLoop:
    """Opens one AsyncBackends per running loop, once, however many callers race for it.

    Owns the map loop -> opening task; a failed opening is forgotten so the next call
    tries again (Postgres may come back)."""

    def __init__(self) -> None:
        self._opening: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, asyncio.Task[AsyncBackends]
        ] = weakref.WeakKeyDictionary()

    def opened(self) -> AsyncBackends | None:
        """The running loop's backends if they are open already, else None (then `get`)."""
        task = self._opening.get(asyncio.get_running_loop())
        if task is None or not task.done() or task.cancelled() or task.exception() is not None:
            return None
        return task.result()

    async def get(self, settings: Settings) -> AsyncBackends:
        loop = asyncio.get_running_loop()
        task = self._opening.get(loop)
        if task is None:
            task = self._opening[loop] = loop.create_task(_open(settings))
        try:
            return await asyncio.shield(task)
        except BaseException:
            if task.done() and self._opening.get(loop) is task:
                del self._opening[loop]
            raise

    async def close(self) -> None:
        """Close the current loop's connections (call it from the app's shutdown hook)."""
        task = self._opening.pop(asyncio.get_running_loop(), None)
        if task is None:
            return
        try:
            backends = await task
        except Exception:  # it never opened: nothing to close
            return
        await backends.close()


async def _open(settings: Settings) -> AsyncBackends:
    store = await AsyncStore.open(settings.database_url, pooled=settings.pgbouncer)
    return AsyncBackends(store, AsyncBroker(settings))
