"""Group commit of finished attempts: one transaction per batch, never waiting to fill one.

Worker threads hand Completions over; this thread writes whatever has accumulated while the
previous batch was committing. The writes are fenced by claim token, so retrying a batch
after an ambiguous commit (connection lost during COMMIT) is safe.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

import psycopg
import redis
from loguru import logger

from hivejobs.broker import Broker
from hivejobs.failpoints import failpoint
from hivejobs.logs import fatal_on_error
from hivejobs.records import Completion
from hivejobs.store import Store

MAX_BATCH = 500


class Completer:
    def __init__(
        self,
        store: Store,
        broker: Broker,
        on_written: Callable[[list[Completion]], None] | None = None,
    ) -> None:
        self.store = store
        self.broker = broker
        self.on_written = on_written
        self._queue: queue.SimpleQueue[Completion | None] = queue.SimpleQueue()
        self._pending = 0
        self._idle = threading.Condition()
        self._thread = threading.Thread(
            target=fatal_on_error(self._run), name="completer", daemon=True
        )
        self.fenced_out = 0
        self.batches = 0

    def start(self) -> None:
        self._thread.start()

    def submit(self, completion: Completion) -> None:
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
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            while len(batch) < MAX_BATCH:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    self._queue.put(None)
                    break
                batch.append(item)
            self._write(batch)
            with self._idle:
                self._pending -= len(batch)
                self._idle.notify_all()

    def _write_unwritable(self, item: Completion, exc: Exception) -> None:
        logger.error(
            "completion cannot be written; failing the job", job_id=item.id, error=repr(exc)
        )
        if item.outcome != "failed":
            self._write(
                [
                    Completion(
                        id=item.id,
                        claim_token=item.claim_token,
                        outcome="failed",
                        error=f"completion could not be stored: {exc!r}",
                    )
                ]
            )

    def _write(self, batch: list[Completion]) -> None:
        delay = 0.05
        while True:
            try:
                with self.store.connection() as conn:
                    written, requeued = self.store.finish(batch, conn)
                # Committed, but as if the reply were lost: the retry must be a fenced no-op.
                failpoint("pool.completion_commit_raises", psycopg.OperationalError)
                break
            except (psycopg.DataError, psycopg.ProgrammingError) as exc:
                # Not a connection problem: retrying the same batch would fail for ever.
                # Write one by one; a completion that cannot be written fails its job.
                if len(batch) > 1:
                    for item in batch:
                        self._write([item])
                    return
                self._write_unwritable(batch[0], exc)
                return
            except psycopg.Error as exc:
                # Fenced writes are idempotent: retrying after an unknown outcome is safe.
                logger.warning(
                    "completion batch failed, retrying",
                    jobs=len(batch),
                    error=repr(exc),
                    retry_in_s=delay,
                )
                time.sleep(delay)
                delay = min(delay * 2, 2.0)
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
                    error=repr(exc),
                )
