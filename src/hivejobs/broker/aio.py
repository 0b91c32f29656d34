"""The broker for event loops (redis.asyncio): the enqueuer's RPUSH of ids and a reader's
subscription to one job's events. The same keys and channels as the Broker (the package
docstring lists them).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from hivejobs.broker import queue_key
from hivejobs.broker.channels import decode_event, events_channel
from hivejobs.broker.clients import AsyncClient, async_client
from hivejobs.config import Settings
from hivejobs.records.events import JobEvent


class AsyncBroker:
    """The enqueuer's side of the broker for event loops: RPUSH of ids over redis.asyncio.

    Owns one async client, which belongs to the event loop that made it.
    """

    def __init__(self, settings: Settings) -> None:
        self.prefix = settings.prefix
        self.redis: AsyncClient = async_client(
            settings.redis_url,
            socket_timeout=settings.redis_socket_timeout_s,
            socket_connect_timeout=settings.redis_socket_timeout_s,
        )

    async def push(self, name: str, priority: int, ids: Sequence[str]) -> None:
        if ids:
            await self.redis.rpush(queue_key(self.prefix, name, priority), *ids)

    async def close(self) -> None:
        await self.redis.aclose()

    async def subscribe_events(self, job_id: str) -> AsyncEventSubscription:
        """A subscription of its own to one job's events (raises RedisError if down)."""
        pubsub = self.redis.pubsub(ignore_subscribe_messages=True)
        await pubsub.subscribe(events_channel(self.prefix, job_id))
        return AsyncEventSubscription(pubsub, job_id)


class AsyncEventSubscription:
    """EventSubscription for event loops (redis.asyncio): opened by AsyncBroker.subscribe_events."""

    def __init__(self, pubsub: Any, job_id: str) -> None:
        self._pubsub = pubsub
        self.job_id = job_id

    async def get(self, timeout_s: float) -> JobEvent | None:
        deadline = time.monotonic() + timeout_s
        while True:
            msg = await self._pubsub.get_message(timeout=max(0.0, deadline - time.monotonic()))
            event = None if msg is None else decode_event(msg["data"], self.job_id)
            if event is not None:
                return event
            if time.monotonic() >= deadline:
                return None

    async def close(self) -> None:
        await self._pubsub.aclose()
