"""Compactor (leader only): gives a drained hot table's space back (VACUUM, REINDEX
CONCURRENTLY), online and in a thread of its own."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import psycopg
from loguru import logger

from hivejobs.config import Settings
from hivejobs.logs import error_fields
from hivejobs.records.dispatch import Lease
from hivejobs.store import Store


class Compactor:
    """After a large backlog drains, the hot table keeps its size: VACUUM leaves the index
    pages allocated. When it is nearly empty but bigger than `compact_above_bytes`, vacuum
    and reindex it online, in a thread of its own so the other services keep their pace.
    Owns that thread (`_thread`, touched only by the coordinator's loop): one at a time."""

    NEARLY_EMPTY = 1000  # live rows: reindexing that many is instant

    name = "compact"

    def __init__(
        self,
        store: Store,
        settings: Settings,
        in_flight: Callable[[], int | None] = lambda: None,
    ) -> None:
        self.store = store
        self.above_bytes = settings.compact_above_bytes
        self.interval_s = max(10.0, settings.coordinator_interval_s)
        self.in_flight = in_flight
        self._thread: threading.Thread | None = None

    def run_once(self, lease: Lease | None = None) -> bool:
        """Start a compaction when one is due; True if it started.

        `in_flight()` (queued + running, from the last gauges pass, None if unknown) gates
        the exact count, which scans past every dead row of a drain: it must not run every
        few seconds while a big backlog drains. No lease needed: compaction changes no row."""
        if self.above_bytes <= 0 or (self._thread is not None and self._thread.is_alive()):
            return False
        in_flight = self.in_flight()
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
