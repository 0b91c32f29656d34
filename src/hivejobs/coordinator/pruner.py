"""Archive retention that keeps up: the leader deletes expired archive rows in batches of
10,000 in a thread of its own until none is left, instead of one batch a minute (which
capped retention at 167 jobs/s sustained). Each batch also drops passed unique windows and
the limit_by token buckets that have refilled to full (store/archive.py prune_archive).

Once the archive is caught up, and at most every SEQUENCE_PRUNE_EVERY_S, it also drops the
counters of sequence keys (hivejobs_sequence) with no live job and no hold that no enqueue
used for the retention: the next job of such a key numbers from 1 again, which orders nothing
differently since nothing of the key is live (store/sequence.sql lock_idle, delete_idle).

Runs only while this coordinator holds the lease; never touches live jobs (hivejobs_job).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import msgspec
import psycopg
from loguru import logger

from hivejobs.logs import error_fields
from hivejobs.records.dispatch import Lease
from hivejobs.store import Store
from hivejobs.store.archive import PRUNE_BATCH, prune_archive
from hivejobs.store.batches import prune_batches
from hivejobs.store.sequence import SequenceStore

# A pass runs until the archive is caught up: a short interval only matters when a pass
# ended early (lease lost, or the max_run_s cap while far behind).
PRUNE_EVERY_S = 10.0
# The idle-counter search reads the whole hivejobs_sequence table (one row per key with a
# recent enqueue): rarely, since an idle row costs only its few bytes meanwhile.
SEQUENCE_PRUNE_EVERY_S = 600.0
SEQUENCE_PRUNE_BATCH = 1000


class PruneResult(msgspec.Struct):
    """What one prune did; `caught_up` false when it stopped early."""

    deleted: int = 0
    seconds: float = 0.0
    caught_up: bool = True
    idle_keys: int = 0  # sequence counters dropped


class Pruner:
    """Owns at most one pruning thread at a time (`_thread`, touched only by the
    coordinator's loop); the thread stops after a batch once `still_leading(lease)` is
    false (the elector's view: no round trip per batch)."""

    name = "prune"
    interval_s = PRUNE_EVERY_S

    def __init__(
        self,
        store: Store,
        retention_s: float,
        max_run_s: float = 50.0,
        still_leading: Callable[[Lease], bool] = lambda lease: True,
    ) -> None:
        self.store = store
        self.sequences = SequenceStore(store)
        self.retention_s = retention_s
        self.max_run_s = max_run_s
        self.still_leading = still_leading
        self.last: PruneResult | None = None
        self._thread: threading.Thread | None = None
        self._sequences_due = 0.0  # monotonic time of the next idle-counter search

    def run_once(self, lease: Lease) -> bool:
        """Start a pruning pass in the background unless one runs; True if started."""
        return self.start(lambda: self.still_leading(lease))

    def prune(self, still_leader: Callable[[], bool]) -> PruneResult:
        """Delete batches until a short batch (caught up), the lease is gone, or
        max_run_s has passed; in the caller's thread (tests, bench)."""
        began = time.monotonic()
        deleted = 0
        while True:
            n = prune_archive(self.store, self.retention_s)  # each type's own retention
            deleted += n
            if n < PRUNE_BATCH:
                # Complete batches go with the archive's retention (their jobs' rows).
                deleted += prune_batches(self.store, self.retention_s)
                keys = self.prune_idle_keys(still_leader)
                return PruneResult(deleted, time.monotonic() - began, True, keys)
            if not still_leader() or time.monotonic() - began > self.max_run_s:
                return PruneResult(deleted, time.monotonic() - began, False)

    def prune_idle_keys(self, still_leader: Callable[[], bool]) -> int:
        """Drop idle sequence counters in batches, when due (SEQUENCE_PRUNE_EVERY_S)."""
        now = time.monotonic()
        if now < self._sequences_due:
            return 0
        self._sequences_due = now + SEQUENCE_PRUNE_EVERY_S
        dropped = 0
        while True:
            n = self.sequences.prune_idle(self.retention_s, SEQUENCE_PRUNE_BATCH)
            dropped += n
            if n < SEQUENCE_PRUNE_BATCH or not still_leader():
                return dropped

    def start(self, still_leader: Callable[[], bool]) -> bool:
        """Start a pruning pass in the background unless one runs; True if started."""
        if self._thread is not None and self._thread.is_alive():
            return False
        self._thread = threading.Thread(
            target=self._run, args=(still_leader,), name="pruner", daemon=True
        )
        self._thread.start()
        return True

    def join(self, timeout_s: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _run(self, still_leader: Callable[[], bool]) -> None:
        try:
            self.last = result = self.prune(still_leader)
        except psycopg.Error as exc:
            logger.warning("archive prune failed; retried later", **error_fields(exc))
            return
        if result.deleted or result.idle_keys:
            logger.info(
                "pruned the archive",
                rows=result.deleted,
                idle_sequence_keys=result.idle_keys,
                rows_per_s=round(result.deleted / max(result.seconds, 1e-3)),
                caught_up=result.caught_up,
            )
