"""Group commit: many threads submit items, one writer thread takes whatever has accumulated
(up to a maximum) each time round and hands it to `write` as one batch.

Shared by the pool's Completer (finished attempts, one Postgres transaction per batch) and
the enqueuer's Pusher in broker/ (ids, one Redis pipeline per batch). Imports nothing of
ours: broker/ may only import records, errors and config besides it.
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
    batch instead of once per item (a thread wake-up per job can cost more CPU than the
    batch's statement per job). By default a batch is never held back to grow: the writer
    takes what is there when it is free, so a batch is as large as what arrived while the
    previous one was being written.

    With `coalesce_to`, a batch smaller than that waits for more, but only while items arrive
    at least every `coalesce_gap_s` (the mean gap between submits, `_gap`), and for no longer
    than the items expected to reach `coalesce_to` take to arrive, at most `coalesce_max_s`.
    A statement's fixed cost (its commit) dominates small batches (with short jobs,
    completions one or two at a time cost Postgres a commit each), while at
    low rates nothing waits: a lone completion is written at once. `write` must handle its
    own errors: one that escapes ends the writer thread (wrap it with `guard`, e.g. to end
    the process)."""

    def __init__(
        self,
        write: Callable[[list[T]], None],
        *,
        max_batch: int,
        name: str,
        guard: Guard = _unguarded,
        coalesce_to: int = 0,
        coalesce_gap_s: float = 0.0,
        coalesce_max_s: float = 0.0,
    ) -> None:
        self._write = write
        self._max_batch = max_batch
        self._coalesce_to = coalesce_to
        self._coalesce_gap_s = coalesce_gap_s
        self._coalesce_max_s = coalesce_max_s
        self._items: list[T] = []  # submitted, not yet taken by the writer (under _cond)
        self._pending = 0
        self._writer_waits = False  # the writer sleeps until an item arrives (under _cond)
        self._gap = float("inf")  # mean seconds between submitted items (under _cond)
        self._last_submit = 0.0
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=guard(self._run), name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, item: T) -> None:
        """Queue one item for the writer; it counts as pending before the call returns."""
        with self._cond:
            self._pending += 1
            self._items.append(item)
            self._arrived(1)
            self._ring()

    def submit_many(self, items: Sequence[T]) -> None:
        with self._cond:
            self._pending += len(items)
            self._items.extend(items)
            self._arrived(len(items))
            self._ring()

    def _arrived(self, count: int) -> None:
        """Follow the mean gap between items (for coalescing); called with `_cond` held."""
        if not self._coalesce_to or not count:
            return
        now, last = time.monotonic(), self._last_submit
        self._last_submit = now
        if not last:
            return
        # An idle minute counts as one long gap, not one that takes hundreds of items to fade.
        gap = min((now - last) / count, 1.0)
        self._gap = gap if self._gap == float("inf") else self._gap + (gap - self._gap) * 0.1

    def _ring(self) -> None:
        """Wake the writer only when it sleeps for want of items: one wake-up per
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
        cond = self._cond
        while True:
            with cond:
                while not self._items:
                    self._writer_waits = True
                    cond.wait()
                window = self._window(len(self._items))
                if window > 0:
                    # Coalesce: submitters do not ring meanwhile (_writer_waits is False);
                    # flush() and idle() only read _pending, which this wait does not hold.
                    cond.wait(window)
                batch = self._items[: self._max_batch]
                del self._items[: self._max_batch]
            self._write(batch)
            with cond:
                self._pending -= len(batch)
                cond.notify_all()

    def _window(self, size: int) -> float:
        """How long a batch of `size` waits for more; called with `_cond` held."""
        return coalesce_window(
            size,
            self._gap,
            to=min(self._coalesce_to, self._max_batch),
            gap_s=self._coalesce_gap_s,
            max_s=self._coalesce_max_s,
        )


def coalesce_window(size: int, gap: float, *, to: int, gap_s: float, max_s: float) -> float:
    """Seconds a batch of `size` waits for more: none once it holds `to` items or while items
    come further apart than `gap_s` (low rates add no latency); else the time the missing
    items should take to arrive at the mean `gap`, at most `max_s`."""
    missing = to - size
    if missing <= 0 or gap > gap_s:
        return 0.0
    return min(gap * missing, max_s)
