"""Connections: an App's Postgres pools, Redis client and id pusher, opened on first use.

Importing an app opens nothing and starts no server: the first call that needs a backend
resolves the URLs (backends.choose_backends, once) and opens what it needs. Never decides
anything about jobs; App does, through these.
"""

from __future__ import annotations

import asyncio
import threading
from types import TracebackType
from typing import TYPE_CHECKING

import psycopg

from hivejobs.broker import Broker
from hivejobs.broker.pusher import Pusher
from hivejobs.client.aio import AsyncBackends, AsyncBackendsByLoop
from hivejobs.config import DEFAULT_DATABASE_URL, DEFAULT_REDIS_URL, Settings
from hivejobs.store import Store, connection_failed
from hivejobs.urls import remember_secrets, warn_plaintext_postgres

if TYPE_CHECKING:
    from hivejobs.embedded.servers import EmbeddedServers


class Connections:
    """The connections of one App, each made once and shared by every thread.

    Owns `_store`, `_read_store`, `_broker` and `_pusher`: each is made on first use under
    `_lock` (checked again inside it, so racing threads open one), and set back to None by
    `close()`, after which the next use opens a new one with the settings of then
    (hivejobs.testing changes them between tests). Owns `embedded`, the servers that the
    backend choice started, kept for the App's life. `settings` is the App's own object:
    `resolve` writes the chosen URLs into it once, before the first connection, and only
    while `backend_source` is "default" (no URL was configured)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.embedded: EmbeddedServers | None = None
        self._store: Store | None = None
        self._read_store: Store | None = None
        self._broker: Broker | None = None
        self._pusher: Pusher | None = None
        self._lock = threading.RLock()
        self._async = AsyncBackendsByLoop()
        self._postgres_errors = PostgresErrors(settings)

    def postgres_errors(self) -> PostgresErrors:
        """A lost or refused connection surfaces as ConnectionFailed, with a redacted URL."""
        return self._postgres_errors

    def resolve(self) -> None:
        """Without configured URLs, pick the local servers or start embedded ones (once).
        Either way, say so if Postgres is off this machine without TLS guarantees."""
        self._choose()
        for url in (
            self.settings.database_url,
            self.settings.listen_database_url,
            self.settings.read_database_url,
        ):
            if url:
                warn_plaintext_postgres(url)

    def _choose(self) -> None:
        if self.settings.backend_source != "default":
            return
        with self._lock:
            if self.settings.backend_source != "default":
                return
            from hivejobs.backends import choose_backends

            # A URL still at its default was not given: the choice may replace it.
            chosen = choose_backends(
                None
                if self.settings.database_url == DEFAULT_DATABASE_URL
                else self.settings.database_url,
                None if self.settings.redis_url == DEFAULT_REDIS_URL else self.settings.redis_url,
            )
            self.settings.database_url = chosen.database_url
            self.settings.redis_url = chosen.redis_url
            self.settings.backend_source = chosen.source
            remember_secrets(chosen.database_url, chosen.redis_url)
            self.embedded = chosen.embedded

    @property
    def store(self) -> Store:
        if self._store is None:
            self.resolve()
            with self._lock:
                if self._store is None:
                    store = Store(self.settings.database_url, pooled=self.settings.pgbouncer)
                    store.check_schema()
                    self._store = store
        return self._store

    @property
    def read_store(self) -> Store:
        """HIVEJOBS_READ_DATABASE_URL's store (a replica, which may lag) when set, else the
        primary's."""
        if not self.settings.read_database_url:
            return self.store
        if self._read_store is None:
            with self._lock:
                if self._read_store is None:
                    self._read_store = Store(
                        self.settings.read_database_url, max_size=2, pooled=self.settings.pgbouncer
                    )
        return self._read_store

    @property
    def pusher(self) -> Pusher:
        if self._pusher is None:
            with self._lock:
                if self._pusher is None:
                    self._pusher = Pusher(self.broker)
        return self._pusher

    @property
    def broker(self) -> Broker:
        if self._broker is None:
            self.resolve()
            with self._lock:
                if self._broker is None:
                    self._broker = Broker(self.settings)
        return self._broker

    def migrate(self) -> list[str]:
        """Create the database if missing and apply pending migrations (idempotent), over a
        store of its own: the App's checks the schema version when it opens."""
        from hivejobs.store import create_database_if_missing

        self.resolve()
        create_database_if_missing(self.settings.database_url)
        store = Store(self.settings.database_url, pooled=self.settings.pgbouncer)
        try:
            return store.migrate()
        finally:
            store.close()

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait until the ids of jobs enqueued so far were pushed to Redis."""
        return self._pusher is None or self._pusher.flush(timeout_s)

    def close(self) -> None:
        self.flush()
        # The pusher holds the broker being closed: a later enqueue makes a new pair (with
        # the settings of then, which hivejobs.testing changes between tests).
        self._pusher = None
        if self._store is not None:
            self._store.close()
            self._store = None
        if self._read_store is not None:
            self._read_store.close()
            self._read_store = None
        if self._broker is not None:
            self._broker.close()
            self._broker = None

    async def async_backends(self) -> AsyncBackends:
        """This event loop's async Postgres pool and Redis client, opened on first use."""
        opened = self._async.opened()
        if opened is not None:  # every call after the first, on every enqueue: no awaits
            return opened
        if self.settings.backend_source == "default":
            await asyncio.to_thread(self.resolve)
        with self.postgres_errors():
            return await self._async.get(self.settings)

    async def aclose(self) -> None:
        """Close this event loop's async connections."""
        await self._async.close()


class PostgresErrors:
    """`with`: psycopg's OperationalError (a lost or refused connection) leaves as
    ConnectionFailed, with the URL redacted. Holds no state of a block, so one serves every
    thread and every nested block; a class, not a generator: it wraps every enqueue."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if isinstance(exc, psycopg.OperationalError):
            raise connection_failed(self._settings.database_url, exc) from None
