"""Group commit of finished attempts: one transaction per batch.

Worker threads hand Completions over; this thread writes whatever has accumulated while the
previous batch was committing, and while completions arrive faster than it writes, what
arrives within one more write's time (COALESCE_FROM); at low rates it never waits. The
writes are fenced by claim token, so retrying a batch after an ambiguous commit (connection
lost during COMMIT) is safe. A completion that cannot
be written (its data, not the connection) is isolated by splitting the batch: it never holds
up the others, and never kills the process.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg
import redis
from loguru import logger

from hivejobs.broker import Broker
from hivejobs.failpoints import failpoint
from hivejobs.logs import error_fields, fatal_on_error
from hivejobs.records import Completion
from hivejobs.serialization import storable_text
from hivejobs.store import Store, is_data_error

MAX_BATCH = 500
# Coalescing (issue 13): when completions arrive faster than one per write (the last batch
# had at least COALESCE_FROM), the next batch waits for more for as long as the last write
# took, at most COALESCE_MAX_S. A statement's fixed cost dominates small batches (a 10-row
# archive took as long in Postgres as a 100-row one), so this about doubles the batch while
# adding at most one write's time to a completion; at low rates (batches of one or two)
# nothing waits.
COALESCE_FROM = 4
COALESCE_MAX_S = 0.002
T = TypeVar("T")

MSG_BATCH_RETRY = "completion batch failed, retrying"
MSG_UNWRITABLE = "completion cannot be written; failing its job with the reason"
MSG_ARCHIVED_DUPLICATE = (
    "job id already in the archive: the archived record is kept, the live duplicate removed"
)
MSG_ABANDONED = "job cannot be finished in Postgres: left running until this process exits"


class Completer:
    def __init__(
        self,
        store: Store,
        broker: Broker,
        on_written: Callable[[list[Completion]], None] | None = None,
        max_error_bytes: int = 1024 * 1024,
        on_submit: Callable[[Completion], None] | None = None,
    ) -> None:
        self.store = store
        self.broker = broker
        self.on_written = on_written
        self.on_submit = on_submit  # sees every outcome once (metrics)
        self._queue: queue.SimpleQueue[Completion | None] = queue.SimpleQueue()
        self._pending = 0
        self._idle = threading.Condition()
        self._thread = threading.Thread(
            target=fatal_on_error(self._run), name="completer", daemon=True
        )
        self.max_error_bytes = max_error_bytes
        self.fenced_out = 0
        self.batches = 0
        self.unwritable = 0  # completions that could not be written as they were

    def start(self) -> None:
        self._thread.start()

    def submit(self, completion: Completion) -> None:
        if self.on_submit is not None:
            self.on_submit(completion)
        with self._idle:
            self._pending += 1
        self._queue.put(completion)

    def idle(self) -> bool:
        with self._idle:
            return self._pending == 0

    def flush(self, timeout_s: float) -> bool:
        """Wait until everything submitted so far is written; False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._idle:
            while self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def _run(self) -> None:
        window = 0.0  # how long the next batch may wait for more (see COALESCE_FROM)
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            deadline = time.monotonic() + window
            while len(batch) < MAX_BATCH:
                left = deadline - time.monotonic()
                try:
                    item = self._queue.get(timeout=left) if left > 0 else self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    self._queue.put(None)
                    break
                batch.append(item)
            began = time.monotonic()
            self._write(batch)
            took = time.monotonic() - began
            window = min(took, COALESCE_MAX_S) if len(batch) >= COALESCE_FROM else 0.0
            with self._idle:
                self._pending -= len(batch)
                self._idle.notify_all()

    def _write(self, batch: list[Completion]) -> None:
        """Write a batch; a batch that cannot be written is split until the completions that
        cannot be written are alone, so that one job's data never holds up another's."""
        try:
            written, requeued = self._commit(batch)
        except Exception as exc:  # noqa: BLE001 - _commit raised a data error, never a lost link
            if len(batch) > 1:
                middle = len(batch) // 2
                self._write(batch[:middle])
                self._write(batch[middle:])
            else:
                self._write_unwritable(batch[0], exc)
            return
        self._written(batch, written, requeued)

    def _commit(self, batch: list[Completion]) -> tuple[int, list[tuple[Any, ...]]]:
        """One transaction for the batch, retried until it commits (see _retrying)."""

        def finish() -> tuple[int, list[tuple[Any, ...]]]:
            with self.store.connection() as conn:
                done = self.store.finish(batch, conn)
            # Committed, but as if the reply were lost: the retry must be a fenced no-op.
            failpoint("pool.completion_commit_raises", psycopg.OperationalError)
            return done

        return _retrying(finish, len(batch))

    def _write_unwritable(self, item: Completion, exc: Exception) -> None:
        """One completion that cannot be written: fail its job with a storable error that
        says why; if even that cannot be written, its id is already archived (the archived
        record wins), or as a last resort the claim is let go so it blocks nothing here."""
        self.unwritable += 1
        log = logger.bind(job_id=item.id, outcome=item.outcome)
        log.error(MSG_UNWRITABLE, **error_fields(exc))
        failure = Completion(
            id=item.id,
            claim_token=item.claim_token,
            outcome="failed",
            error=storable_text(
                f"completion ({item.outcome}) could not be stored: "
                f"{type(exc).__name__}: {exc}\n{item.error or ''}",
                self.max_error_bytes,
            ),
        )
        try:
            written, requeued = self._commit([failure])
        except Exception as again:  # noqa: BLE001 - a data error again: the row itself
            exc = again
        else:
            self._written([failure], written, requeued)
            return
        try:
            dropped = _retrying(
                lambda: self.store.drop_archived_duplicate_if_running(item.id, item.claim_token), 1
            )
        except Exception as again:  # noqa: BLE001 - a data error: nothing more to try
            dropped, exc = False, again
        if dropped:
            log.error(MSG_ARCHIVED_DUPLICATE)
        else:
            # Nothing we can write: stop tracking it, the rescue of this process ends it.
            log.critical(MSG_ABANDONED, **error_fields(exc))
        if self.on_written is not None:
            self.on_written([item])

    def _written(
        self, batch: list[Completion], written: int, requeued: list[tuple[Any, ...]]
    ) -> None:
        self.batches += 1
        if self.on_written is not None:
            self.on_written(batch)
        if written < len(batch):
            self.fenced_out += len(batch) - written
            logger.warning(
                "claim lost: completion fenced out (job rescued or timed out)",
                jobs=len(batch) - written,
            )
        queued = [(r[0], r[1], r[2]) for r in requeued if r[3] == "queued"]
        if queued:
            try:
                self.broker.push_many(queued)
            except redis.RedisError as exc:
                logger.warning(
                    "requeued jobs not pushed; the reconciler will",
                    jobs=len(queued),
                    **error_fields(exc),
                )


def _retrying(write: Callable[[], T], jobs: int) -> T:
    """Run a write until it commits. Connection and server failures are retried with
    backoff: the writes are fenced by claim token, so retrying after an unknown outcome is
    safe. A data error (is_data_error) is raised at once: retrying would fail again."""
    delay = 0.05
    while True:
        try:
            return write()
        except psycopg.Error as exc:
            if is_data_error(exc):
                raise
            logger.warning(MSG_BATCH_RETRY, jobs=jobs, retry_in_s=delay, **error_fields(exc))
            time.sleep(delay)
            delay = min(delay * 2, 2.0)
