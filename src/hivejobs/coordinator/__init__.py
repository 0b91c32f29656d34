"""The coordinator process: one active per fleet (leader lease), running the services.

Every instance runs one; followers only try to take the lease. The loop's wait is a LISTEN on
hivejobs_dispatch, which carries jobs enqueued inside a caller's transaction (NOTIFY is
delivered only on commit), so those are pushed to Redis at once.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections.abc import Iterable

import psycopg
import redis
from loguru import logger

from hivejobs.broker import Broker
from hivejobs.chains.traverser import Traverser
from hivejobs.config import Settings
from hivejobs.coordinator.callbacks import CallbackTimeouts
from hivejobs.coordinator.elector import Elector
from hivejobs.coordinator.pruner import Pruner
from hivejobs.coordinator.scheduler import Scheduler
from hivejobs.coordinator.services import Compactor, Gauges, Promoter, Reconciler, Rescuer
from hivejobs.errors import ConnectionFailed
from hivejobs.failpoints import failpoint
from hivejobs.logs import error_fields
from hivejobs.store import Store, connect
from hivejobs.store.enqueue import parse_dispatch

GUARD_RECHECK_S = 10.0  # a coordinator refusing to lead looks again this often
# A pass runs until the archive is caught up (coordinator/pruner.py): a short interval only
# matters when a pass ended early (lease lost, or the 50 s cap while far behind).
PRUNE_EVERY_S = 10.0
MSG_BAD_DISPATCH = "malformed dispatch notifications ignored (the first is shown)"


class Coordinator:
    def __init__(self, settings: Settings, worker_id: str) -> None:
        self.settings = settings
        self.worker_id = worker_id
        # A leader paused mid-transaction (SIGSTOP, VM stall) holds the lease row's share lock:
        # Postgres ends such a session before the lease could expire, so a follower can take
        # over; followers never queue behind that lock for long.
        idle_ms = int(max(settings.lease_ttl_s - settings.lease_margin_s, 1.0) * 1000)
        self.store = Store(
            settings.database_url,
            max_size=2,
            session={"idle_in_transaction_session_timeout": str(idle_ms), "lock_timeout": "2000"},
            pooled=settings.pgbouncer,
        )
        # Without that guard a paused leader would block every follower: such a coordinator
        # never leads (it says why, and checks again now and then).
        self._guard_checked_at: float | None = None
        self._guard_missing: list[str] = []
        self.broker = Broker(settings)
        self.elector = Elector(self.store, worker_id, settings)
        self.promoter = Promoter(self.store, self.broker)
        self.rescuer = Rescuer(self.store, self.broker, settings)
        self.reconciler = Reconciler(self.store, self.broker)
        self.gauges = Gauges(self.store)
        self.pruner = Pruner(self.store, settings.archive_retention_s)
        self.compactor = Compactor(self.store, settings)
        self.callback_timeouts = CallbackTimeouts(self.store, self.broker)
        self.traverser = Traverser(self.store, self.broker)
        self.scheduler = Scheduler(self.store, self.broker)
        self._chains_due = True  # look for chain work at once (chains_to_traverse)
        self._chain_hints: set[str] = set()  # chains a wake-up named: traverse just these
        self.stop = threading.Event()
        self._due: dict[str, float] = {}
        self._listen: psycopg.Connection[object] | None = None
        self._wake: redis.client.PubSub | None = None  # Redis wake-ups, without a LISTEN

    def run(self) -> int:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda *_: self.stop.set())
        self.store.register_worker(
            self.worker_id, socket.gethostname(), os.getpid(), "coordinator", None
        )
        last_beat = 0.0
        while not self.stop.is_set():
            if self._stall_guard_in_force():
                self.elector.tick()
            if time.monotonic() - last_beat > self.settings.heartbeat_s:
                last_beat = time.monotonic()
                self._guard("heartbeat", self._heartbeat)
            lease = self.elector.lease
            if lease is not None:
                failpoint("coord.after_lease_before_action")
                self._services(lease)
            self._wait_for_dispatch(lease is not None)
        self.elector.resign()
        self._guard("deregister", lambda: self.store.deregister_worker(self.worker_id))
        return 0

    def _stall_guard_in_force(self) -> bool:
        now = time.monotonic()
        if self._guard_checked_at is None or (
            self._guard_missing and now - self._guard_checked_at > GUARD_RECHECK_S
        ):
            try:
                missing = self.store.session_not_in_force()
            except psycopg.Error as exc:
                logger.warning("could not check the stall guard", error=repr(exc))
                return False
            self._guard_checked_at = now
            if missing and missing != self._guard_missing:
                logger.error(
                    "this coordinator will not lead: its stall guard is not in force in its "
                    "transactions (a paused leader would block every follower); behind a "
                    "pooler set HIVEJOBS_PGBOUNCER=1, or let the role have these settings",
                    missing=missing,
                )
            self._guard_missing = missing
        return not self._guard_missing

    def _heartbeat(self) -> None:
        if not self.store.heartbeat(self.worker_id):  # declared dead while we were away
            self.store.register_worker(
                self.worker_id, socket.gethostname(), os.getpid(), "coordinator", None
            )

    def _every(self, name: str, interval_s: float) -> bool:
        now = time.monotonic()
        if now >= self._due.get(name, 0.0):
            self._due[name] = now + interval_s
            return True
        return False

    def _services(self, lease: tuple[str, int]) -> None:
        s = self.settings
        # Chain hops wait on this pass, so it goes first; the rest is periodic upkeep.
        full = self._every("traverse", s.coordinator_interval_s) or self._chains_due
        if full or self._chain_hints:
            only = None if full else self._chain_hints
            self._chains_due, self._chain_hints = False, set()
            self._guard("traverse", lambda: self._traverse(lease, only))
        if self._every("schedule", min(1.0, s.coordinator_interval_s)):
            self._guard("schedule", lambda: self.scheduler.run_once(lease))
        if self._every("promote", s.promote_interval_s):
            self._guard("promote", lambda: self.promoter.run_once(lease))
        if self._every("rescue", s.coordinator_interval_s):
            self._guard("rescue", lambda: self.rescuer.run_once(lease, self.elector.healthy_for()))
        if self._every("callbacks", s.coordinator_interval_s):
            self._guard("callbacks", lambda: self.callback_timeouts.run_once(lease))
        if self._every("reconcile", s.coordinator_interval_s):
            self._guard("reconcile", lambda: self.reconciler.run_once(lease))
        if self._every("gauges", max(5.0, s.coordinator_interval_s)):
            self._guard("gauges", self.gauges.run_once)
        if self._every("prune", PRUNE_EVERY_S):
            # Per job type retention where one is declared, else the global setting.
            self.pruner.start(lambda: self.elector.term == lease[1])
        if self._every("compact", max(10.0, s.coordinator_interval_s)):
            self._guard("compact", lambda: self.compactor.run_once(self.gauges.in_flight))

    def _traverse(self, lease: tuple[str, int], only: set[str] | None) -> None:
        result = self.traverser.run_once(lease, only)
        self._chains_due = result.more

    def _guard(self, what: str, fn: object) -> None:
        try:
            fn()  # type: ignore[operator]
        except (psycopg.Error, redis.RedisError) as exc:
            logger.warning("coordinator step failed", step=what, **error_fields(exc))

    def _wait_for_dispatch(self, leader: bool) -> None:
        """Sleep until the next tick, pushing ids of transactional enqueues as they commit."""
        # Chain work left over from a capped pass: only collect what is already here.
        busy = leader and (self._chains_due or bool(self._chain_hints))
        timeout = 0.0 if busy else self.settings.promote_interval_s
        try:
            if self._listen is None:
                url = listen_url(self.settings)
                if url is None:
                    # LISTEN through a transaction-mode pooler hears nothing: pools announce
                    # finished chain tries over Redis instead; transactional enqueues wait
                    # for the reconciler (docs/scaling.md: HIVEJOBS_LISTEN_DATABASE_URL).
                    self._wait_for_redis_wake(leader, timeout)
                    return
                self._listen = connect(url)
                self._listen.execute("LISTEN hivejobs_dispatch")
                self._listen.execute("LISTEN hivejobs_chain")
            entries: list[tuple[str, str, int]] = []
            # stop_after=1 returns with the first packet of notifications, all of it (never
            # leave a notifies() generator early: the rest of its packet would be lost).
            notes = list(self._listen.notifies(timeout=timeout, stop_after=1))
            if notes:
                # A chain try finished (or a chain came, or was stopped): traverse now, this
                # is the hop latency between a job and its successor; a transactional
                # enqueue committed: push it now, this is its pickup latency. One pass
                # serves every notification already here, so collect those too.
                notes += self._listen.notifies(timeout=0.0, stop_after=1000)
            self._collect(notes, entries)
            if not leader:
                # Followers keep no wake-ups: a new leader starts with a full search anyway.
                self._chain_hints.clear()
            if entries and leader:
                self._push(entries)
        except (psycopg.Error, redis.RedisError, ValueError, ConnectionFailed) as exc:
            logger.warning("dispatch listener failed", **error_fields(exc))
            if self._listen is not None:
                self._listen.close()
            if self._wake is not None:
                self._wake.close()
            self._listen, self._wake = None, None
            self.stop.wait(timeout)

    def _wait_for_redis_wake(self, leader: bool, timeout: float) -> None:
        if self._wake is None:
            wake = self.broker.redis.pubsub(  # type: ignore[no-untyped-call]
                ignore_subscribe_messages=True
            )
            wake.subscribe(self.broker.wake_channel)
            self._wake = wake
        message = self._wake.get_message(timeout=timeout)
        while message is not None:
            # One pass serves every wake-up already here.
            if leader and isinstance(message.get("data"), bytes):
                self._chain_hints.update(filter(None, message["data"].decode().split(",")))
            message = self._wake.get_message(timeout=0.0)

    def _push(self, entries: list[tuple[str, str, int]]) -> None:
        """A push that fails (Redis down, a refused key) loses only latency: the reconciler
        pushes these ids after its grace. The listener stays: its next notes are not lost."""
        try:
            self.broker.push_many(entries)
        except redis.RedisError as exc:
            logger.warning(
                "dispatched ids not pushed; the reconciler will",
                jobs=len(entries),
                **error_fields(exc),
            )

    def _collect(
        self,
        notes: Iterable[psycopg.Notify],
        entries: list[tuple[str, str, int]],
    ) -> bool:
        """Sort notifications into dispatch entries and chain wake-ups; True if a chain
        wake-up came."""
        woken = False
        malformed: list[psycopg.Notify] = []
        for note in notes:
            if note.channel == "hivejobs_chain":
                if note.payload:
                    self._chain_hints.update(note.payload.split(","))
                else:
                    self._chains_due = True
                woken = True
            else:
                try:
                    entries.extend(parse_dispatch(note.payload))
                except ValueError:
                    malformed.append(note)  # only this one is lost: the rest are dispatched
        if malformed:
            # Anyone who can connect may NOTIFY: one line per batch, however many came.
            first = malformed[0]
            logger.warning(
                MSG_BAD_DISPATCH, notes=len(malformed), payload=first.payload[:200], pid=first.pid
            )
        return woken


def listen_url(settings: Settings) -> str | None:
    """Where the coordinator LISTENs: its own direct URL if given, else the database URL
    unless that is a transaction-mode pooler (None: no session to listen on)."""
    if settings.listen_database_url:
        return settings.listen_database_url
    return None if settings.pgbouncer else settings.database_url


def run_coordinator(settings: Settings, worker_id: str) -> int:
    return Coordinator(settings, worker_id).run()
