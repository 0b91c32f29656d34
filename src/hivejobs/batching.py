"""Group commit: many threads submit items, one writer thread takes whatever has accumulated
(up to a maximum) each time round and hands it to `write` as one batch.

Shared by the pool's Completer (finished attempts, one Postgres transaction per batch) and
the enqueuer's Pusher in broker.py (ids, one Redis pipeline per batch). Imports nothing of
ours: broker.py may only import records, errors and config besides it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")
Guard = Callable[[Callable[[], None]], Callable[[], None]]


def _unguarded(target: Callable[[], None]) -> Callable[[], None]:
    return target


class Batcher(Generic[T]):
    """Owns the submitted items (`_items`), the one writer thread that empties it, and the
    count of items submitted and not yet written (`_pending`); all three guarded by `_cond`,
    which is notified after every batch. Submitters wake the writer only when it sleeps for
    want of items (`_writer_waits`): with many threads submitting, the writer wakes once per
    batch instead of once per item (issue 13: a thread wake-up per job cost more CPU than the
    batch's statement per job). By default a batch is never held back to grow: the writer takes what
    is there when it is free, so a batch is as large as what arrived while the previous one
    was being written. With `coalesce_from`, once a batch had at least that many items (items
    arrive faster than one per write), the next one waits for more for as long as the last
    write took, at most `coalesce_max_s`: a statement's fixed cost dominates small batches
    (issue 13: a 10-row archive cost Postgres about as much as a 100-row one), and at low
    rates (batches of one or two) nothing waits. `write` must handle its own errors: one that
    escapes ends the writer thread (wrap it with `guard`, e.g. to end the process)."""

    def __init__(
        self,
        write: Callable[[list[T]], None],
        *,
        max_batch: int,
        name: str,
        guard: Guard = _unguarded,
        coalesce_from: int | None = None,
        coalesce_max_s: float = 0.0,
    ) -> None:
        self._write = write
        self._max_batch = max_batch
        self._coalesce_from = coalesce_from
        self._coalesce_max_s = coalesce_max_s
        self._items: list[T] = []  # submitted, not yet taken by the writer (under _cond)
        self._pending = 0
        self._writer_waits = False  # the writer sleeps until an item arrives (under _cond)
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=guard(self._run), name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, item: T) -> None:
        """Queue one item for the writer; it counts as pending before the call returns."""
        with self._cond:
            self._pending += 1
            self._items.append(item)
            self._ring()

    def submit_many(self, items: Sequence[T]) -> None:
        with self._cond:
            self._pending += len(items)
            self._items.extend(items)
            self._ring()

    def _ring(self) -> None:
        """Wake the writer only when it sleeps for want of items (issue 13): one wake-up per
        batch, not one per item. Called with `_cond` held."""
        if self._writer_waits:
            self._writer_waits = False
            self._cond.notify_all()

    def idle(self) -> bool:
        with self._cond:
            return self._pending == 0

    def flush(self, timeout_s: float) -> bool:
        """Wait until everything submitted so far is written; False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def _run(self) -> None:
        window = 0.0  # how long the next batch may wait for more (see coalesce_from)
        cond = self._cond
        while True:
            with cond:
                while not self._items:
                    self._writer_waits = True
                    cond.wait()
                if window > 0 and len(self._items) < self._max_batch:
                    # Coalesce: submitters do not ring meanwhile (_writer_waits is False);
                    # flush() and idle() only read _pending, which this wait does not hold.
                    cond.wait(window)
                batch = self._items[: self._max_batch]
                del self._items[: self._max_batch]
            began = time.monotonic()
            self._write(batch)
            window = self._next_window(len(batch), time.monotonic() - began)
            with cond:
                self._pending -= len(batch)
                cond.notify_all()

    def _next_window(self, size: int, took_s: float) -> float:
        if self._coalesce_from is None or size < self._coalesce_from:
            return 0.0
        return min(took_s, self._coalesce_max_s)
