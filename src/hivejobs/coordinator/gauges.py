"""Gauges (leader only): queue depth per type and jobs in flight, in hivejobs_gauge; and the
count of queued rows they share with the reconciler (QueuedCounts)."""

from __future__ import annotations

import time

from loguru import logger

from hivejobs.records import Lease
from hivejobs.store import Store
from hivejobs.store.upkeep import nonzero_gauge_types


class QueuedCounts:
    """Queued rows per (type, priority), counted in Postgres: owns the reconciler's last
    count and when it was made. The reconciler needs a fresh count beside fresh Redis
    lengths (a stale one would show ids popped since as missing); a gauge may be a few
    seconds old. A count reads every queued row (7 ms at 20,000 under load), so the gauges
    take the reconciler's when it is recent instead of counting again (issue 13: with both
    counting, the counts were most of the coordinator's Postgres CPU during a drain of slow
    jobs)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._last: dict[tuple[str, int], int] = {}
        self._counted_at: float | None = None

    def fresh(self) -> dict[tuple[str, int], int]:
        """A count now, kept for the gauges (the reconciler's)."""
        self._last = self.store.queued_counts()
        self._counted_at = time.monotonic()
        return self._last

    def recent(self, max_age_s: float) -> dict[tuple[str, int], int]:
        """The reconciler's last count if it is younger than `max_age_s`, else one made now
        and not kept: a count is only shared from the reconciler's side, so that two passes
        of the gauges in a row never read the first one's."""
        if self._counted_at is None or time.monotonic() - self._counted_at >= max_age_s:
            return self.store.queued_counts()
        return self._last


class Gauges:
    """Queue depth per type and jobs in flight: logged and kept in hivejobs_gauge. Owns
    `in_flight`, which the Compactor reads to skip its exact count while a backlog drains."""

    name = "gauges"

    def __init__(
        self, store: Store, interval_s: float = 5.0, counts: QueuedCounts | None = None
    ) -> None:
        self.store = store
        self.interval_s = interval_s
        self.counts = counts or QueuedCounts(store)
        self.in_flight: int | None = None  # queued + running at the last pass

    def run_once(self, lease: Lease | None = None) -> dict[str, int]:
        """Measure and store the gauges; `lease` is not needed (they are measurements, and
        a follower's late write is overwritten by the leader's next pass)."""
        queued: dict[str, int] = {}
        for (name, _), n in self.counts.recent(self.interval_s).items():
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
