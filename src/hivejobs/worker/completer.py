"""Group commit of finished attempts: one transaction per batch.

Runner threads hand Completions over; one writer thread (hivejobs.batching, shared with
the broker's Pusher) writes whatever has accumulated while the previous batch was
committing, and while completions arrive often (COALESCE_GAP_S), what arrives within a
few more milliseconds (COALESCE_MAX_S); at low rates it never waits. The writes are fenced
by claim token, so retrying a batch after an ambiguous commit (connection lost during
COMMIT) is safe. A completion that cannot be written (its data, not the connection) is
isolated by splitting the batch: it never holds up the others, and never kills the process.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import psycopg
from loguru import logger

from hivejobs.batching import Batcher
from hivejobs.broker import Broker
from hivejobs.broker.hints import left_to_reconciler
from hivejobs.failpoints import failpoint
from hivejobs.logs import error_fields
from hivejobs.records.dispatch import Requeued
from hivejobs.records.jobs import Completion
from hivejobs.serialization import storable_text
from hivejobs.store import Store, is_data_error
from hivejobs.worker.exits import fatal_on_error

MAX_BATCH = 500
# Coalescing (see hivejobs.batching): while completions arrive at least every
# COALESCE_GAP_S (100/s in this process), a batch of fewer than COALESCE_TO waits for more,
# at most COALESCE_MAX_S, so that two or more arrive in the longest wait. With 10 ms jobs on
# 8 runners (one completion per 1.25 ms) a batch holds ~14 instead of 1.4; with 10 ms
# CPU-bound jobs (130/s a process on 2 cores) ~10 instead of 4.4, which took the pool
# backends' CPU per job from 0.20 to 0.13 ms. Short jobs' batches pass COALESCE_TO while
# the previous one is written and never wait (waiting for 32 cost them ~10 % of throughput:
# more completions unwritten held their claims back). A completion is written at most
# COALESCE_MAX_S later; below 100/s a lone completion is written at once.
COALESCE_TO = 16
COALESCE_GAP_S = 0.01
COALESCE_MAX_S = 0.02
T = TypeVar("T")

MSG_BATCH_RETRY = "completion batch failed, retrying"
MSG_UNWRITABLE = "completion cannot be written; failing its job with the reason"
MSG_ARCHIVED_DUPLICATE = (
    "job id already in the archive: the archived record is kept, the live duplicate removed"
)
MSG_ABANDONED = "job cannot be finished in Postgres: left running until this process exits"


class Completer:
    """Owns the writing of finished attempts: the batcher (its queue, its one writer thread
    and its pending count) and the counters below, which only the writer thread changes.
    Keeps the invariant that every submitted completion is written, fenced out, or (if it
    cannot be written at all) let go and reported through `on_written`, exactly once."""

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
        self._batcher = Batcher(
            self._write,
            max_batch=MAX_BATCH,
            name="completer",
            guard=fatal_on_error,
            coalesce_to=COALESCE_TO,
            coalesce_gap_s=COALESCE_GAP_S,
            coalesce_max_s=COALESCE_MAX_S,
        )
        self.max_error_bytes = max_error_bytes
        self.fenced_out = 0
        self.batches = 0
        self.unwritable = 0  # completions that could not be written as they were

    def start(self) -> None:
        self._batcher.start()

    def submit(self, completion: Completion) -> None:
        if self.on_submit is not None:
            self.on_submit(completion)
        self._batcher.submit(completion)

    def submit_many(self, completions: list[Completion]) -> None:
        """submit() for each, with one hand-off to the writer."""
        if self.on_submit is not None:
            for completion in completions:
                self.on_submit(completion)
        self._batcher.submit_many(completions)

    def idle(self) -> bool:
        return self._batcher.idle()

    def flush(self, timeout_s: float) -> bool:
        """Wait until everything submitted so far is written; False on timeout."""
        return self._batcher.flush(timeout_s)

    def _write(self, batch: list[Completion]) -> None:
        """Write a batch; a batch that cannot be written is split until the completions that
        cannot be written are alone, so that one job's data never holds up another's."""
        try:
            written, requeued = self._commit(batch)
        except Exception as exc:  # _commit raised a data error, never a lost link
            if len(batch) > 1:
                middle = len(batch) // 2
                self._write(batch[:middle])
                self._write(batch[middle:])
            else:
                self._write_unwritable(batch[0], exc)
            return
        self._written(batch, written, requeued)

    def _commit(self, batch: list[Completion]) -> tuple[int, list[Requeued]]:
        """One transaction for the batch, retried until it commits (see _retrying)."""

        def finish() -> tuple[int, list[Requeued]]:
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
        except Exception as again:  # a data error again: the row itself
            exc = again
        else:
            self._written([failure], written, requeued)
            return
        try:
            dropped = _retrying(
                lambda: self.store.drop_archived_duplicate_if_running(item.id, item.claim_token), 1
            )
        except Exception as again:  # a data error: nothing more to try
            dropped, exc = False, again
        if dropped:
            log.error(MSG_ARCHIVED_DUPLICATE)
        else:
            # Nothing we can write: stop tracking it, the rescue of this process ends it.
            log.critical(MSG_ABANDONED, **error_fields(exc))
        if self.on_written is not None:
            self.on_written([item])

    def _written(self, batch: list[Completion], written: int, requeued: list[Requeued]) -> None:
        self.batches += 1
        if self.on_written is not None:
            self.on_written(batch)
        if written < len(batch):
            self.fenced_out += len(batch) - written
            logger.warning(
                "claim lost: completion fenced out (job rescued or timed out)",
                jobs=len(batch) - written,
            )
        queued = [(r.id, r.name, r.priority) for r in requeued if r.state == "queued"]
        if queued:
            with left_to_reconciler("requeued jobs", jobs=len(queued)):
                self.broker.push_many(queued)


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
