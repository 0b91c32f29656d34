"""Dispatcher: the coordinator loop's wait, which pushes the ids of jobs enqueued inside a
caller's transaction as they commit and hands chain wake-ups to the traverser.

Its wait is the loop's sleep: a LISTEN session (store/notify.py) where one exists, else,
behind a transaction-mode pooler without a listen URL, the broker's wake channel, on which
pools announce finished chain tries (transactional enqueues then wait for the reconciler;
docs/scaling.md: HIVEJOBS_LISTEN_DATABASE_URL).
"""

from __future__ import annotations

import threading

import psycopg
import redis
from loguru import logger

from hivejobs.broker import Broker
from hivejobs.broker.hints import left_to_reconciler
from hivejobs.config import Settings
from hivejobs.coordinator.traverser import Traverser
from hivejobs.errors import ConnectionFailed
from hivejobs.logs import error_fields
from hivejobs.records.dispatch import Lease, Push
from hivejobs.store.notify import Heard, Listener

MSG_BAD_DISPATCH = "malformed dispatch notifications ignored (the first is shown)"


def listen_url(settings: Settings) -> str | None:
    """Where the coordinator LISTENs: its own direct URL if given, else the database URL
    unless that is a transaction-mode pooler (None: no session to listen on)."""
    if settings.listen_database_url:
        return settings.listen_database_url
    return None if settings.pgbouncer else settings.database_url


class Dispatcher:
    """Owns the listening session (or the Redis wake subscription), opened on first use and
    reopened after an error. Runs in every coordinator, leader or not, since its wait is the
    loop's sleep; only a leader (`lease` given) pushes and keeps wake-ups."""

    name = "dispatch"

    def __init__(
        self, settings: Settings, broker: Broker, traverser: Traverser, stop: threading.Event
    ) -> None:
        self.broker = broker
        self.stop = stop
        self.traverser = traverser
        self.interval_s = settings.promote_interval_s  # the longest wait
        url = listen_url(settings)
        self._listener = Listener(url) if url is not None else None
        self._wake: redis.client.PubSub | None = None

    def run_once(self, lease: Lease | None) -> None:
        """Wait until the next tick (at once when chain work is left over from a capped
        pass), pushing what transactional enqueues committed meanwhile."""
        leader = lease is not None
        timeout = 0.0 if leader and self.traverser.pending else self.interval_s
        try:
            heard = self._wait(timeout)
        except (psycopg.Error, redis.RedisError, ValueError, ConnectionFailed) as exc:
            logger.warning("dispatch listener failed", **error_fields(exc))
            self.close()
            self.stop.wait(timeout)  # a database refusing connections is not hammered
            return
        if not leader:
            self.traverser.forget()
            return
        # A chain try finished (or a chain came, or was stopped): traverse now, this is the
        # hop latency between a job and its successor; a transactional enqueue committed:
        # push it now, this is its pickup latency.
        self.traverser.wake(heard.chains, heard.search_chains)
        if heard.malformed:
            # Anyone who can connect may NOTIFY: one line per batch, however many came.
            first = heard.malformed[0]
            logger.warning(
                MSG_BAD_DISPATCH,
                notes=len(heard.malformed),
                payload=first.payload[:200],
                pid=first.pid,
            )
        if heard.pushes:
            self._push(heard.pushes)

    def close(self) -> None:
        if self._listener is not None:
            self._listener.close()
        if self._wake is not None:
            self._wake.close()
        self._wake = None

    def _wait(self, timeout: float) -> Heard:
        if self._listener is not None:
            return self._listener.wait(timeout)
        # LISTEN through a transaction-mode pooler hears nothing: pools announce finished
        # chain tries over Redis instead.
        if self._wake is None:
            wake = self.broker.redis.pubsub(  # type: ignore[no-untyped-call,unused-ignore]  # typed from redis 8.2
                ignore_subscribe_messages=True
            )
            wake.subscribe(self.broker.wake_channel)
            self._wake = wake
        heard = Heard()
        message = self._wake.get_message(timeout=timeout)
        while message is not None:
            # One pass serves every wake-up already here.
            if isinstance(message.get("data"), bytes):
                heard.chains.update(filter(None, message["data"].decode().split(",")))
            message = self._wake.get_message(timeout=0.0)
        return heard

    def _push(self, pushes: list[Push]) -> None:
        """A push that fails (Redis down, a refused key) loses only latency: the reconciler
        pushes these ids after its grace. The listener stays: its next notes are not lost."""
        with left_to_reconciler("dispatched jobs", jobs=len(pushes)):
            self.broker.push_many(pushes)
