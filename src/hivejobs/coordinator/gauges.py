"""Gauges (leader only): queue depth per type and jobs in flight, in hivejobs_gauge; and a
warning when queued jobs have no live worker of their type. The depth counts every queued
job: dispatched ones and sequenced ones parked behind their key (sequence.py)."""

from __future__ import annotations

import time

from loguru import logger

from hivejobs.records.dispatch import Lease
from hivejobs.store import Store
from hivejobs.store.archive import nonzero_gauge_types
from hivejobs.store.sequence import SequenceStore

# The queue depth is a count of every queued row (7 ms at 20,000 queued under load, 50 ms
# at 200,000): after counting N rows, the next count waits N / ROWS_PER_SECOND_OF_AGE s when
# that is longer than the interval (20 s at 100,000 queued), which keeps it under ~0.2 % of
# a core at any backlog. Jobs in flight are counted at every pass (the running
# rows only).
ROWS_PER_SECOND_OF_AGE = 5_000


class Gauges:
    """Queue depth per type and jobs in flight: kept in hivejobs_gauge, logged when they
    change. Owns `in_flight`, which the Compactor reads to skip its exact count while a
    backlog drains, the last count of queued rows (`_queued`) with when it was made, the last
    depth it logged, and since when each type has had queued jobs and no live pool."""

    name = "gauges"

    def __init__(
        self,
        store: Store,
        interval_s: float = 5.0,
        stuck_after_s: float = 30.0,
        unserved_after_s: float | None = None,
    ) -> None:
        self.store = store
        self.interval_s = interval_s
        self.in_flight: int | None = None  # queued + running at the last pass
        self._queued: dict[tuple[str, int], int] = {}
        self._parked: dict[str, int] = {}  # counted with _queued
        self.sequences = SequenceStore(store)
        self._count_due = 0.0
        self._logged: dict[str, object] | None = None
        # A pool whose heartbeat is older than this is dead (the Rescuer's bound).
        self.stuck_after_s = stuck_after_s
        # A fleet that is starting registers its pools within seconds: a type is reported
        # unserved only after this long, and once until it is served again.
        self.unserved_after_s = stuck_after_s if unserved_after_s is None else unserved_after_s
        self._unserved_since: dict[str, float] = {}
        self._warned: frozenset[str] = frozenset()

    def run_once(self, lease: Lease | None = None) -> dict[str, int]:
        """Measure and store the gauges; `lease` is not needed (they are measurements, and
        a follower's late write is overwritten by the leader's next pass)."""
        dispatched = self._queued_counts()
        queued = dict(self._parked)
        for (name, _), n in dispatched.items():
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
        depth: dict[str, object] = {**total, "by_type": {n: queued.get(n, 0) for n in names}}
        # An idle fleet measures the same depth every pass: a line only when it changed.
        if names and depth != self._logged:
            logger.info("queue depth", **depth)
        self._logged = depth
        self._warn_unserved({n for n, k in queued.items() if k > 0})
        return total

    def _warn_unserved(self, waiting: set[str]) -> None:
        """Jobs queued for a type that no live pool serves wait for ever: say so, once."""
        now = time.monotonic()
        live = self.store.live_pools(self.stuck_after_s) if waiting else {}
        unserved = waiting - set(live)
        self._unserved_since = {n: self._unserved_since.get(n, now) for n in unserved}
        due = frozenset(
            n for n, t in self._unserved_since.items() if now - t >= self.unserved_after_s
        )
        if due - self._warned:
            logger.warning(
                "jobs are queued for types no live worker serves: start a worker whose app"
                " registers them",
                types=sorted(due),
            )
        self._warned = due

    def _queued_counts(self) -> dict[tuple[str, int], int]:
        """A count now, or the last one while it is younger than its rows allow."""
        now = time.monotonic()
        if now >= self._count_due:
            self._queued = self.store.queued_counts()
            self._parked = self.sequences.parked_counts()
            rows = sum(self._queued.values()) + sum(self._parked.values())
            self._count_due = now + rows / ROWS_PER_SECOND_OF_AGE
        return self._queued
