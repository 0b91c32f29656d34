"""The leader-only services, each with run_once(lease) so tests can drive one pass.

Promoter: due scheduled jobs to queued, expired and cancelled waiting jobs to the archive.
Rescuer: claims of processes whose heartbeat is older than stuck_after (R6: only once this
coordinator has been healthy that long). Reconciler: Redis lists from Postgres, after a flush
(boot marker missing) or when a list holds fewer ids than Postgres has queued (R1).
Gauges: queue depth and in-flight counts. Compactor: a drained hot table's space back.
Every write of job state checks the lease term (R7).
"""

from __future__ import annotations

import threading
import time
import uuid
from datetime import datetime

import msgspec
import psycopg
from loguru import logger

from hivejobs.broker import Broker, KeyRefused
from hivejobs.config import Settings
from hivejobs.failpoints import failpoint
from hivejobs.logs import error_fields
from hivejobs.metrics import bump
from hivejobs.records import Rescued
from hivejobs.store import Store, is_data_error
from hivejobs.store.upkeep import nonzero_gauge_types

Lease = tuple[str, int]
BATCH = 10_000

MSG_KEY_REFUSED = "Redis refused a queue key (only its own list waits)"
MSG_RESCUE_UNWRITABLE = "claims of a dead process cannot be rescued; other processes' can"
MSG_ARCHIVED_DUPLICATE_RESCUED = (
    "dead process held jobs whose id is already in the archive: the archived record is kept,"
    " the live duplicate removed"
)


class PromoteResult(msgspec.Struct):
    promoted: int = 0
    ended: int = 0


class Promoter:
    def __init__(self, store: Store, broker: Broker) -> None:
        self.store, self.broker = store, broker

    def run_once(self, lease: Lease) -> PromoteResult:
        result = PromoteResult()
        rows = self.store.leader_write(lease, "promote_due", {"limit": BATCH}) or []
        if rows:
            self.broker.push_many([(r[0], r[1], r[2]) for r in rows])
            result.promoted = len(rows)
        ended = self.store.leader_write(lease, "end_waiting_jobs", {"limit": BATCH}) or []
        result.ended = len(ended)
        return result


class RescueResult(msgspec.Struct):
    dead_workers: int = 0
    requeued: int = 0
    failed: int = 0
    skipped_unhealthy: bool = False


class Rescuer:
    def __init__(self, store: Store, broker: Broker, settings: Settings) -> None:
        self.store, self.broker = store, broker
        self.stuck_after_s = settings.stuck_after_s
        self.poison_after = settings.poison_pill_after

    def run_once(self, lease: Lease, healthy_for_s: float) -> RescueResult:
        if healthy_for_s < self.stuck_after_s:
            # After an outage every heartbeat looks stale: wait until ours is trustworthy.
            return RescueResult(skipped_unhealthy=True)
        dead = self.store.find_dead_workers(self.stuck_after_s)
        if not dead:
            return RescueResult()
        failpoint("coord.mid_rescue_batch")
        rescued = rescue_isolated(self.store, dead, self.poison_after, lease)
        if rescued is None:
            return RescueResult()
        if rescued.requeued:
            self.broker.push_many(rescued.requeued)
            bump(self.broker, "rescued", [r[1] for r in rescued.requeued])
        logger.warning(
            "rescued jobs of dead workers",
            workers=len(dead),
            requeued=len(rescued.requeued),
            failed=rescued.failed,
        )
        return RescueResult(len(dead), len(rescued.requeued), rescued.failed)


def rescue_isolated(
    store: Store, worker_ids: list[str], poison_after: int, lease: Lease | None = None
) -> Rescued | None:
    """Rescue dead processes' claims so that one row that cannot be written blocks only its
    own process's rescue, not every other one: on a data error, one process at a time.
    A connection error propagates (the next pass retries). None when the lease was lost."""
    try:
        rescued = store.rescue_workers(worker_ids, poison_after, lease)
    except Exception as exc:  # noqa: BLE001 - classified below
        if not is_data_error(exc):
            raise
        if len(worker_ids) == 1:
            logger.error(MSG_RESCUE_UNWRITABLE, worker_id=worker_ids[0], **error_fields(exc))
            return Rescued(requeued=[], failed=0, archived_duplicates=[])
        parts = [rescue_isolated(store, [w], poison_after, lease) for w in worker_ids]
        if any(p is None for p in parts):
            return None
        rescued = Rescued(
            requeued=[r for p in parts if p for r in p.requeued],
            failed=sum(p.failed for p in parts if p),
            archived_duplicates=[d for p in parts if p for d in p.archived_duplicates],
        )
    if rescued is not None and rescued.archived_duplicates:
        logger.error(
            MSG_ARCHIVED_DUPLICATE_RESCUED,
            jobs=len(rescued.archived_duplicates),
            job_ids=rescued.archived_duplicates[:20],
        )
    return rescued


class ReconcileResult(msgspec.Struct):
    full_restore: bool = False
    pushed: int = 0


class Reconciler:
    """Owns `refused`: the keys Redis refused at the last pass, so that a bad key is logged
    when it goes bad and when it heals, not at every pass."""

    def __init__(self, store: Store, broker: Broker, grace_s: float = 2.0) -> None:
        self.store, self.broker = store, broker
        self.grace_s = grace_s
        self.refused: set[str] = set()

    def run_once(self, lease: Lease) -> ReconcileResult:
        if not self.broker.boot_marker_present():
            return ReconcileResult(True, self._restore_all())
        pushed = 0
        pg = self.store.queued_counts()
        lengths = self._lengths({name for name, _ in pg})
        for (name, priority), count in pg.items():
            if (name, priority) not in lengths:
                continue  # its key is refused (logged): only this list waits
            missing = count - lengths[(name, priority)]
            if missing <= 0:
                continue
            rows = (
                self.store.leader_write(
                    lease,
                    "stale_queued",
                    {
                        "name": name,
                        "priority": priority,
                        "grace_s": self.grace_s,
                        "limit": min(missing, BATCH),
                    },
                )
                or []
            )
            if rows:
                pushed += self._push([(r[0], r[1], r[2]) for r in rows])
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

    def _push(self, entries: list[tuple[str, str, int]]) -> int:
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
        """No boot marker: Redis was flushed or restarted empty, or this is its first use.
        Push every queued id of each list that is empty, keyset-paged per queue (the queued
        index leads with the queue); a list that still holds ids (a first start after
        enqueues) is left to the deficit check, so a fresh Redis does not get every id
        twice."""
        marker = str(uuid.uuid4())
        pg = self.store.queued_counts()
        lengths = self._lengths({name for name, _ in pg})
        empty = sorted(queue for queue in pg if lengths.get(queue, -1) == 0)
        pushed = 0
        for queue in empty:
            after: tuple[datetime, str] | None = None
            while True:
                rows = self.store.queued_page(queue, after, BATCH)
                if not rows:
                    break
                pushed += self._push([(r[0], r[1], r[2]) for r in rows])
                failpoint("coord.mid_reconcile_batch")
                after = (rows[-1][3], rows[-1][0])
        self.broker.set_boot_marker(marker)
        logger.warning(
            "Redis had no boot marker (flushed or restarted): restored queues", jobs=pushed
        )
        return pushed


class Gauges:
    """Queue depth per type and jobs in flight: logged and kept in hivejobs_gauge."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.in_flight: int | None = None  # queued + running at the last pass

    def run_once(self) -> dict[str, int]:
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


class Compactor:
    """After a large backlog drains, the hot table keeps its size: VACUUM leaves the index
    pages allocated. When it is nearly empty but bigger than `compact_above_bytes`, vacuum
    and reindex it online, in a thread of its own so the other services keep their pace."""

    NEARLY_EMPTY = 1000  # live rows: reindexing that many is instant

    def __init__(self, store: Store, settings: Settings) -> None:
        self.store = store
        self.above_bytes = settings.compact_above_bytes
        self._thread: threading.Thread | None = None

    def run_once(self, in_flight: int | None) -> bool:
        """Start a compaction when one is due; True if it started.

        `in_flight` (queued + running, from the last gauges pass, None if unknown) gates the
        exact count, which scans past every dead row of a drain: it must not run every few
        seconds while a big backlog drains."""
        if self.above_bytes <= 0 or (self._thread is not None and self._thread.is_alive()):
            return False
        if in_flight is None or in_flight > self.NEARLY_EMPTY:
            return False
        live, size = self.store.hot_table_size(self.NEARLY_EMPTY + 1)
        if live > self.NEARLY_EMPTY or size <= self.above_bytes:
            return False
        self._thread = threading.Thread(
            target=self._compact, args=(size,), name="compactor", daemon=True
        )
        self._thread.start()
        return True

    def join(self, timeout_s: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _compact(self, size: int) -> None:
        began = time.monotonic()
        try:
            self.store.compact_hot_table()
            _, after = self.store.hot_table_size(1)
        except psycopg.Error as exc:
            logger.warning("hot table compaction failed; retried later", **error_fields(exc))
            return
        logger.info(
            "compacted the drained hot table",
            bytes_before=size,
            bytes_after=after,
            seconds=round(time.monotonic() - began, 2),
        )
