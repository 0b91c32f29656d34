"""The children of `hivejobs run`'s supervisor (worker/supervisor.py): the record of each
(Child), the restart backoff, the process group a pool leads and its ending, the signals sent
to a child, the metrics child's main, and the release of a dead child's claims (R8).

Opens a Postgres or Redis connection only for one step and closes it before returning:
nothing stays open across the supervisor's next fork.
"""

from __future__ import annotations

import errno
import os
import signal
from dataclasses import dataclass

from loguru import logger

from hivejobs.broker import Broker
from hivejobs.broker.hints import left_to_reconciler
from hivejobs.config import Settings
from hivejobs.coordinator.rescuer import rescue_isolated
from hivejobs.logs import error_fields
from hivejobs.metrics import bump
from hivejobs.store import Store

RESTART_BACKOFF_MAX_S = 30.0
HEALTHY_AFTER_S = 3.0  # lived this long: it started fine, so a death is not a crash loop


@dataclass
class Child:
    """One child the supervisor keeps running: its role, and the state of its current
    process (pid 0 while none runs) and of its restarts. Only the supervisor's main loop
    reads or writes it (signal handlers only set flags on the Supervisor)."""

    role: str  # "pool", "coordinator", "metrics" (`--metrics-port`) or "watcher" (--reload)
    pool: str | None
    slot: int
    types: tuple[str, ...] = ()  # a pool's job types (one lane and one worker row each)
    pid: int = 0
    worker_ids: tuple[str, ...] = ()  # one per type; one for a child that runs no type
    started: float = 0.0
    crashes: int = 0
    restart_at: float | None = None

    @property
    def worker_id(self) -> str:
        return self.worker_ids[0] if self.worker_ids else ""

    @property
    def title(self) -> str:
        return f"pool {self.pool}#{self.slot}" if self.role == "pool" else self.role


def short_store(settings: Settings) -> Store:
    """A one-connection store for one step (the start-up checks, a release, a report),
    closed by the caller: nothing stays open across the supervisor's next fork."""
    return Store(
        settings.database_url,
        max_size=1,
        pooled=settings.pgbouncer,
        role="hivejobs supervisor",
    )


def release_claims(settings: Settings, worker_ids: list[str]) -> None:
    """R8: a child we saw die cannot finish its jobs; release them now, not after
    stuck_after. A short-lived pool: nothing stays open across the next fork."""
    try:
        store = short_store(settings)
        try:
            rescued = rescue_isolated(store, worker_ids, settings.poison_pill_after)
        finally:
            store.close()
    except Exception as exc:  # the coordinator will rescue
        logger.warning("could not release a dead child's jobs", **error_fields(exc))
        return
    if rescued is None:  # no lease was asked for: cannot happen
        return
    if rescued.requeued:
        broker = Broker(settings)
        try:
            with left_to_reconciler("released jobs", jobs=len(rescued.requeued)):
                broker.push_many(rescued.requeued)
                bump(broker, "rescued", [r[1] for r in rescued.requeued])
        finally:
            broker.close()
    if rescued.requeued or rescued.failed:
        logger.warning(
            "released jobs of a dead child",
            requeued=len(rescued.requeued),
            failed=rescued.failed,
        )


def run_metrics_child(settings: Settings, host: str, port: int) -> int:
    """A child of its own: an HTTP thread in the supervisor would be copied half-way into
    every fork. It holds no claims, so a crash only pauses scrapes until its restart."""
    import threading

    from hivejobs.worker.metrics_server import MetricsServer

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    token = os.environ.get("HIVEJOBS_METRICS_TOKEN", "").strip()
    MetricsServer(settings, host, port, token).serve(stop)
    return 0


def kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except OSError as exc:
        if exc.errno != errno.ESRCH:
            raise


def own_group(pid: int) -> None:
    """A pool leads its own process group, which holds whatever its handlers start: the
    group can be ended with the pool (end_group). PDEATHSIG kills only the pool itself."""
    try:
        os.setpgid(pid, pid)
    except OSError as exc:
        # The other side of the fork already did it, or the child is already gone.
        if exc.errno not in (errno.EACCES, errno.ESRCH, errno.EPERM):
            raise


def end_group(pgid: int) -> None:
    """A pool exited (or is being killed): end what its handlers started, which would keep
    its title and its inherited Postgres and Redis sockets."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError as exc:
        if exc.errno not in (errno.ESRCH, errno.EPERM):
            raise
