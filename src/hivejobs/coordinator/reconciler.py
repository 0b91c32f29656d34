"""Reconciler (leader only): Redis lists from Postgres, so that Redis loses latency, never a
job (rule R1 in docs/concepts/reliability.md: Redis carries hints, Postgres the truth).

Two triggers: the boot marker is missing (Redis was flushed or restarted empty, or this is the
first start on its prefix: restore every empty list), or a list holds fewer ids than Postgres
has queued for it (a crash between commit and push, an evicted key: re-push the ids queued
longer than the grace). The second needs a count of every queued row, which grows with the
backlog (3 ms a pass at 8,000 queued, 50 ms at 200,000): it runs once a pass, or after a
wait that grows with the rows it counted last (ROWS_PER_SECOND_OF_WAIT), which keeps its
cost to Postgres under ~0.2 % of a core at any backlog (issue 13: counting 20,000 queued rows
every second was most of the coordinator's Postgres CPU in a drain of 10 ms jobs). A lost id
in a backlog of N then waits up to N / 5,000 s: less than the backlog ahead of it takes to
drain at any throughput under 5,000 jobs/s. The wait follows the rows, not the time the
count took: a count slowed by an outage (a connection awaited) must not put the next one off.
"""

from __future__ import annotations

import time
import uuid
from datetime import datetime

import msgspec
from loguru import logger

from hivejobs.broker import Broker, KeyRefused
from hivejobs.coordinator.gauges import QueuedCounts
from hivejobs.failpoints import failpoint
from hivejobs.logs import error_fields
from hivejobs.records import Lease, Push
from hivejobs.store import Store

BATCH = 10_000
# A second between deficit checks for every this many queued rows counted (a count reads
# ~2.5 million rows a second on our 2-core machine: 0.2 % of a core); at least one pass.
ROWS_PER_SECOND_OF_WAIT = 5_000
MSG_KEY_REFUSED = "Redis refused a queue key (only its own list waits)"
MSG_FLUSHED = "Redis had no boot marker (flushed or restarted): restored queues"
MSG_FIRST_START = "first start on this Redis prefix: boot marker set"


class ReconcileResult(msgspec.Struct):
    """What one pass did: a full restore (no boot marker) or a deficit re-push."""

    full_restore: bool = False
    pushed: int = 0


class Reconciler:
    """Owns `refused`: the keys Redis refused at the last pass, so that a bad key is logged
    when it goes bad and when it heals, not at every pass; and `_count_due`, the monotonic
    time of the next deficit check (ROWS_PER_SECOND_OF_WAIT)."""

    name = "reconcile"

    def __init__(
        self,
        store: Store,
        broker: Broker,
        grace_s: float = 2.0,
        interval_s: float = 1.0,
        counts: QueuedCounts | None = None,
    ) -> None:
        self.store, self.broker = store, broker
        self.counts = counts or QueuedCounts(store)
        self.grace_s = grace_s
        self.interval_s = interval_s
        self.refused: set[str] = set()
        self._count_due = 0.0

    def run_once(self, lease: Lease) -> ReconcileResult:
        if not self.broker.boot_marker_present():
            return ReconcileResult(True, self._restore_all())
        started = time.monotonic()
        if started < self._count_due:
            return ReconcileResult(False, 0)
        pushed = 0
        pg = self.counts.fresh()
        self._count_due = started + sum(pg.values()) / ROWS_PER_SECOND_OF_WAIT
        lengths = self._lengths({name for name, _ in pg})
        for (name, priority), count in pg.items():
            if (name, priority) not in lengths:
                continue  # its key is refused (logged): only this list waits
            missing = count - lengths[(name, priority)]
            if missing <= 0:
                continue
            stale = self.store.stale_queued_if_leader(
                lease, (name, priority), self.grace_s, min(missing, BATCH)
            )
            if stale is None:
                break  # the lease is lost: the next leader reconciles
            if stale:
                pushed += self._push(stale)
        if pushed:
            logger.info("re-pushed queued jobs missing from Redis", jobs=pushed)
        return ReconcileResult(False, pushed)

    def _lengths(self, names: set[str]) -> dict[tuple[str, int], int]:
        lengths, refused = self.broker.queue_lengths(names)
        for key, exc in refused.items():
            if key not in self.refused:
                logger.error(MSG_KEY_REFUSED, key=key, **error_fields(exc))
        for key in self.refused - set(refused):
            logger.info("Redis key accepted again", key=key)
        self.refused = set(refused)
        return lengths

    def _push(self, entries: list[Push]) -> int:
        """Push one list's ids; a list Redis refuses fails alone (its rows were re-stamped
        queued_at = now(), so the next pass after the grace tries again)."""
        try:
            return self.broker.push_many(entries)
        except KeyRefused as exc:
            if exc.key not in self.refused:
                self.refused.add(exc.key)
                logger.error(MSG_KEY_REFUSED, key=exc.key, **error_fields(exc))
            return 0

    def _restore_all(self) -> int:
        """No boot marker: Redis was flushed or restarted empty, or this is the first start on
        this prefix. Push every queued id of each list that is empty, keyset-paged per queue
        (the queued index leads with the queue); a list that still holds ids (a first start
        after enqueues) is left to the deficit check, so a fresh Redis does not get every id
        twice. Postgres remembers each marker set (migration 0013): only then is a missing
        one news."""
        marker = str(uuid.uuid4())
        prefix = self.broker.prefix
        flushed = self.store.boot_marker_recorded(prefix)
        pg = self.counts.fresh()
        failpoint("coord.between_restore_reads")  # tests: widen the window pools pop in
        lengths = self._lengths({name for name, _ in pg})
        empty = sorted(queue for queue in pg if lengths.get(queue, -1) == 0)
        pushed = 0
        for queue in empty:
            after: tuple[datetime, str] | None = None
            while True:
                rows = self.store.queued_page(queue, after, BATCH)
                if not rows:
                    break
                pushed += self._push([Push(r.id, r.name, r.priority) for r in rows])
                failpoint("coord.mid_reconcile_batch")
                after = (rows[-1].queued_at, rows[-1].id)
        self.broker.set_boot_marker(marker)
        self.store.record_boot_marker(prefix, marker)
        if flushed and pushed:
            logger.warning(MSG_FLUSHED, jobs=pushed)
        elif flushed:
            logger.info("Redis had no boot marker: nothing queued to restore; marker set")
        else:
            # A first start is no news, even with ids pushed: a job enqueued meanwhile may be
            # popped between the two reads above and pushed again (its claim fences it).
            logger.info(MSG_FIRST_START, jobs=pushed)
        return pushed
