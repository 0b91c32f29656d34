"""Group commit: many threads submit items, one writer thread takes whatever has accumulated
(up to a maximum) each time round and hands it to `write` as one batch.

Shared by the pool's Completer (finished attempts, one Postgres transaction per batch) and
the enqueuer's Pusher in broker.py (ids, one Redis pipeline per batch). Imports nothing of
ours: broker.py may only import records, errors and config besides it.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")
Guard = Callable[[Callable[[], None]], Callable[[], None]]


def _unguarded(target: Callable[[], None]) -> Callable[[], None]:
    return target


class Batcher(Generic[T]):
    """Owns a queue of submitted items, the one writer thread that empties it, and the count
    of items submitted and not yet written (`_pending`, guarded by `_cond`, which is notified
    after every batch). By default a batch is never held back to grow: the writer takes what
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
        self._queue: queue.SimpleQueue[T] = queue.SimpleQueue()
        self._pending = 0
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=guard(self._run), name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, item: T) -> None:
        """Queue one item for the writer; it counts as pending before the call returns."""
        with self._cond:
            self._pending += 1
        self._queue.put(item)

    def submit_many(self, items: Sequence[T]) -> None:
        with self._cond:
            self._pending += len(items)
        for item in items:
            self._queue.put(item)

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
        while True:
            batch = [self._queue.get()]
            deadline = time.monotonic() + window
            while len(batch) < self._max_batch:
                left = deadline - time.monotonic()
                try:
                    batch.append(
                        self._queue.get(timeout=left) if left > 0 else self._queue.get_nowait()
                    )
                except queue.Empty:
                    break
            began = time.monotonic()
            self._write(batch)
            window = self._next_window(len(batch), time.monotonic() - began)
            with self._cond:
                self._pending -= len(batch)
                self._cond.notify_all()

    def _next_window(self, size: int, took_s: float) -> float:
        if self._coalesce_from is None or size < self._coalesce_from:
            return 0.0
        return min(took_s, self._coalesce_max_s)
