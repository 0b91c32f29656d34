"""Gauges (leader only): queue depth per type and jobs in flight, in hivejobs_gauge."""

from __future__ import annotations

from loguru import logger

from hivejobs.records import Lease
from hivejobs.store import Store
from hivejobs.store.upkeep import nonzero_gauge_types


class Gauges:
    """Queue depth per type and jobs in flight: logged and kept in hivejobs_gauge. Owns
    `in_flight`, which the Compactor reads to skip its exact count while a backlog drains."""

    name = "gauges"

    def __init__(self, store: Store, interval_s: float = 5.0) -> None:
        self.store = store
        self.interval_s = interval_s
        self.in_flight: int | None = None  # queued + running at the last pass

    def run_once(self, lease: Lease | None = None) -> dict[str, int]:
        """Measure and store the gauges; `lease` is not needed (they are measurements, and
        a follower's late write is overwritten by the leader's next pass)."""
        queued: dict[str, int] = {}
        for (name, _), n in self.store.queued_counts().items():
            queued[name] = queued.get(name, 0) + n
        running = self.store.running_counts()
        # A type whose jobs all ended is in neither count: zero its gauges, or they would
        # keep their last non-zero values for ever ("running 4" long after its last job).
        names = sorted(set(queued) | set(running) | nonzero_gauge_types(self.store))
        values = [("queued", n, queued.get(n, 0)) for n in names]
        values += [("running", n, running.get(n, 0)) for n in names]
        self.store.set_gauges(values)
        total = {"queued": sum(queued.values()), "running": sum(running.values())}
        self.in_flight = total["queued"] + total["running"]
        if names:
            logger.info("queue depth", **total, by_type={n: queued.get(n, 0) for n in names})
        return total
