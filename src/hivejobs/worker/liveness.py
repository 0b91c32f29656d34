"""Liveness of a pool process: the heartbeat that proves it alive, the release of claims
Postgres says it holds but it no longer tracks, and the control messages of the fleet.

One heartbeat per process (not per job) on the database clock (R5): one statement for the
worker rows of all its lanes (one row per job type it runs, see placement.py). A process one of
whose worker rows is gone was declared dead and its claims rescued: it exits rather than run
on fenced.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import psycopg
import redis
from loguru import logger

from hivejobs.broker import Broker
from hivejobs.broker.channels import ControlMessage
from hivejobs.config import Settings
from hivejobs.logs import error_fields
from hivejobs.store import Store
from hivejobs.worker.exits import ChildExit, fatal_on_error
from hivejobs.worker.fetcher import Claims
from hivejobs.worker.shutdown import Stop, StopReason
from hivejobs.worker.slots import Slots

CONTROL_POLL_S = 1.0


def _exit_declared_dead() -> None:
    os._exit(ChildExit.DECLARED_DEAD)


@dataclass(frozen=True)
class Tracked:
    """What liveness watches of one lane (one job type) of the process: its worker row, its
    claims and slots, and whether its claims commit asynchronously (only those can be lost
    in a Postgres crash: see Pool)."""

    worker_id: str
    claims: Claims
    slots: Slots
    check_untracked: bool


class Liveness:
    """Owns the heartbeat thread and the control thread, `last_ok` (the monotonic time at
    which the last heartbeat Postgres accepted was sent; written by the heartbeat thread only,
    read by the fetchers without a lock: a float) and the control subscription. `subscribed`
    is set once the first subscription stands (a message published before it is not seen).
    Both loops end after stop(): the pool calls it once its shutdown has written its
    completions, just before it removes its worker rows, so no heartbeat can find a row gone
    meanwhile. `names`: the pool's name and its types', any of which `hivejobs restart
    --pool` may give."""

    def __init__(
        self,
        names: Collection[str],
        lanes: Sequence[Tracked],
        settings: Settings,
        store: Store,
        broker: Broker,
        stop: Stop,
        *,
        declared_dead: Callable[[], None] = _exit_declared_dead,
    ) -> None:
        self.names = frozenset(names)
        self.lanes = list(lanes)
        self.worker_ids = [lane.worker_id for lane in self.lanes]
        self.settings = settings
        self.store = store
        self.broker = broker
        self.stop_state = stop
        self.declared_dead = declared_dead
        self.last_ok = time.monotonic()
        self.subscribed = threading.Event()
        self._stopped = threading.Event()
        self.log = logger.bind(pool=",".join(sorted(self.names)), worker_id=self.worker_ids[0])
        self._heartbeat_thread = threading.Thread(
            target=fatal_on_error(self._heartbeat), name="heartbeat", daemon=True
        )
        self._control_thread = threading.Thread(
            target=fatal_on_error(self._control), name="control", daemon=True
        )

    def start(self) -> None:
        self._heartbeat_thread.start()
        self._control_thread.start()

    def heartbeat_age_s(self) -> float:
        return time.monotonic() - self.last_ok

    def stop(self, timeout_s: float = 5.0) -> None:
        """End both loops; wait for the heartbeat (a statement may be in flight)."""
        self._stopped.set()
        self._heartbeat_thread.join(timeout_s)

    def join(self, timeout_s: float) -> bool:
        """Wait for both threads to end after stop(); True if they did."""
        for t in (self._heartbeat_thread, self._control_thread):
            t.join(timeout_s)
        return not (self._heartbeat_thread.is_alive() or self._control_thread.is_alive())

    # -- heartbeat -----------------------------------------------------------------------

    def _heartbeat(self) -> None:
        while not self._stopped.is_set():
            # The heartbeat proves us alive as of when it was sent, not when its answer came:
            # a partition can hold the answer of a heartbeat Postgres took just before it,
            # long enough for the coordinator to declare us dead meanwhile; dated from its
            # arrival, it would let the fetchers claim under worker rows already deleted.
            sent = time.monotonic()
            try:
                if not self.store.heartbeat_all(self.worker_ids):
                    # The coordinator rescued our claims: anything we finish now is fenced.
                    self.log.error("worker row gone (declared dead): exiting")
                    self.declared_dead()
                    return
                self.last_ok = sent
                for lane in self.lanes:
                    if lane.check_untracked:
                        self._release_untracked_claims(lane)
            except (psycopg.Error, redis.RedisError) as exc:
                self.log.warning("heartbeat failed", **error_fields(exc))
            self._stopped.wait(self.settings.heartbeat_s)

    def _release_untracked_claims(self, lane: Tracked) -> None:
        """After a Postgres crash an asynchronously committed completion may be gone, leaving
        a `running` row that this live process no longer tracks: put it back in the queue."""
        lost = lane.claims.untracked(lambda: self.store.running_claims(lane.worker_id))
        if lost:
            # Most are completions that committed between the read and the check above
            # (already archived, so nothing to release): only real releases are news.
            released = self.store.release_claims(lane.worker_id, lost)
            if released:
                self.broker.push_many(released)
                self.log.warning(
                    "released claims this process no longer tracks", jobs=len(released)
                )

    # -- control -------------------------------------------------------------------------

    def _control(self) -> None:
        while not self._stopped.is_set():
            try:
                subscription = self.broker.subscribe_control()
            except redis.RedisError as exc:
                self.log.debug("control channel lost, resubscribing", **error_fields(exc))
                self._stopped.wait(0.5)
                continue
            self.subscribed.set()
            try:
                while not self._stopped.is_set():
                    msg = subscription.get(CONTROL_POLL_S)
                    if msg is not None:
                        self.on_control(msg)
            except redis.RedisError as exc:
                self.log.debug("control channel lost, resubscribing", **error_fields(exc))
                self._stopped.wait(0.5)
            finally:
                subscription.close()

    def on_control(self, msg: ControlMessage) -> None:
        """Act on one control message: a cancel of a job running here, or a restart."""
        if msg.action == "cancel" and msg.job_id:
            for lane in self.lanes:  # a no-op in the lanes that do not run it
                lane.slots.cancel(msg.job_id)
        elif msg.action == "restart" and restart_applies(msg, self.names):
            # A restart of one pool recycles just this process (forked again by the same
            # supervisor); a restart of everything or of this instance reloads the instance.
            self.stop_state.request(StopReason.POOL_RESTART if msg.pool else StopReason.RELOAD)


def restart_applies(msg: ControlMessage, names: Collection[str]) -> bool:
    """Whether a restart message names this pool or one of its types (or every pool) on this
    instance (or all)."""
    if msg.pool is not None and msg.pool not in names:
        return False
    return msg.instance is None or msg.instance in instance_names()


def instance_names() -> tuple[str, str]:
    """How `hivejobs restart --instance` may name this instance: its host, or host:pid of
    its supervisor (this pool's parent; `hivejobs run` logs it as it starts)."""
    host = socket.gethostname()
    return host, f"{host}:{os.getppid()}"
