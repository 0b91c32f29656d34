"""The coordinator process: one active per fleet (leader lease), a loop over its services.

Every instance runs one; followers only try to take the lease. Each tick: the elector
acquires or renews the lease, the heartbeat is written, and while the lease is held every
service whose interval has passed runs one pass (coordinator/service.py). The tick's sleep
is the dispatcher's wait (coordinator/dispatcher.py), which pushes transactional enqueues
as they commit and wakes the traverser when a chain try ends.

Layer: under worker/ (which runs it in a process of its own); may import chains, jobtypes,
flow, store, broker and the bottom modules, never worker, client or anything above.
"""

from __future__ import annotations

import functools
import os
import signal
import socket
import threading
import time
from collections.abc import Callable

import psycopg
import redis
from loguru import logger

from hivejobs.broker import Broker
from hivejobs.config import Settings
from hivejobs.coordinator.callbacks import CallbackTimeouts
from hivejobs.coordinator.compactor import Compactor
from hivejobs.coordinator.dispatcher import Dispatcher, listen_url
from hivejobs.coordinator.elector import Elector
from hivejobs.coordinator.gauges import Gauges
from hivejobs.coordinator.promoter import Promoter
from hivejobs.coordinator.pruner import Pruner
from hivejobs.coordinator.reconciler import Reconciler
from hivejobs.coordinator.rescuer import Rescuer
from hivejobs.coordinator.scheduler import Scheduler
from hivejobs.coordinator.sequencer import Sequencer
from hivejobs.coordinator.service import Service
from hivejobs.coordinator.traverser import Traverser
from hivejobs.failpoints import failpoint
from hivejobs.logs import error_fields
from hivejobs.records.dispatch import Lease
from hivejobs.store import PREPARED_PLANS, Store

__all__ = ["Coordinator", "listen_url", "run_coordinator"]

GUARD_RECHECK_S = 10.0  # a coordinator refusing to lead looks again this often


class Coordinator:
    """Owns the coordinator's store, broker, elector and services, and when each service is
    next due (`_next`). Everything runs on the loop's thread except the pruner's and the
    compactor's passes, which own a thread each."""

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
            session={
                "idle_in_transaction_session_timeout": str(idle_ms),
                "lock_timeout": "2000",
                **({} if settings.pgbouncer else PREPARED_PLANS),
            },
            pooled=settings.pgbouncer,
            role="hivejobs coordinator",
        )
        # Without that guard a paused leader would block every follower: such a coordinator
        # never leads (it says why, and checks again now and then).
        self._guard_checked_at: float | None = None
        self._guard_missing: list[str] = []
        self.stop = threading.Event()
        self.broker = Broker(settings)
        self.elector = Elector(self.store, worker_id, settings)
        self.services: list[Service] = self._services(settings)
        self._next: dict[str, float] = {}

    def _services(self, s: Settings) -> list[Service]:
        """In the order a tick runs them: chain hops wait on the traverser, so it goes
        first; the rest is periodic upkeep."""
        store, broker = self.store, self.broker
        self.traverser = Traverser(store, broker, search_every_s=s.coordinator_interval_s)
        self.dispatcher = Dispatcher(s, broker, self.traverser, self.stop)
        self.gauges = Gauges(
            store, interval_s=max(5.0, s.coordinator_interval_s), stuck_after_s=s.stuck_after_s
        )
        return [
            self.traverser,
            Scheduler(store, broker, interval_s=min(1.0, s.coordinator_interval_s)),
            Promoter(
                store,
                broker,
                interval_s=s.promote_interval_s,
                end_every_s=s.coordinator_interval_s,
            ),
            Rescuer(store, broker, s, healthy_for=self.elector.healthy_for),
            CallbackTimeouts(store, broker, interval_s=s.coordinator_interval_s),
            Reconciler(store, broker, interval_s=s.coordinator_interval_s),
            Sequencer(store, broker, interval_s=max(10.0, s.coordinator_interval_s)),
            self.gauges,
            # Per job type retention where one is declared, else the global setting.
            Pruner(store, s.archive_retention_s, still_leading=self._still_leading),
            Compactor(store, s, in_flight=lambda: self.gauges.in_flight),
        ]

    def run(self) -> int:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda *_: self.stop.set())
        self._register()
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
                self._run_due(lease)
            self._guard(self.dispatcher.name, functools.partial(self.dispatcher.run_once, lease))
        self.elector.resign()
        self.dispatcher.close()
        self._guard("deregister", lambda: self.store.deregister_worker(self.worker_id))
        return 0

    def _run_due(self, lease: Lease) -> None:
        for service in self.services:
            now = time.monotonic()
            if now < self._next.get(service.name, 0.0):
                continue
            self._next[service.name] = now + service.interval_s
            self._guard(service.name, functools.partial(service.run_once, lease))

    def _still_leading(self, lease: Lease) -> bool:
        return self.elector.term == lease[1]

    def _stall_guard_in_force(self) -> bool:
        now = time.monotonic()
        if self._guard_checked_at is None or (
            self._guard_missing and now - self._guard_checked_at > GUARD_RECHECK_S
        ):
            try:
                missing = self.store.session_not_in_force()
            except psycopg.Error as exc:
                logger.warning("could not check the stall guard", **error_fields(exc))
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

    def _register(self) -> None:
        self.store.register_worker(
            self.worker_id, socket.gethostname(), os.getpid(), "coordinator", None
        )

    def _heartbeat(self) -> None:
        if not self.store.heartbeat(self.worker_id):  # declared dead while we were away
            self._register()

    def _guard(self, what: str, fn: Callable[[], object]) -> None:
        try:
            fn()
        except (psycopg.Error, redis.RedisError) as exc:
            logger.warning("coordinator step failed", step=what, **error_fields(exc))


def run_coordinator(settings: Settings, worker_id: str) -> int:
    return Coordinator(settings, worker_id).run()
