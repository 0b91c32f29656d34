"""Jobs (jobs.sql): enqueue, claim, finish, release, cancel, read; and the job types.

The hot path: every statement here that ends a claim is fenced by its claim token (rule R3
in docs/concepts/reliability.md), so a late write from a rescued or timed-out claim changes
nothing. Never decides policy (retries, delivery): callers pass outcomes.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any

import msgspec
from psycopg.rows import class_row

from hivejobs.records.dispatch import HeldClaim, JobRef, Push, Requeued
from hivejobs.records.fleet import TypeCounts
from hivejobs.records.jobs import ClaimedJob, Completion, Inserted, JobTypeInfo, NewJob
from hivejobs.store.callbacks import await_callbacks, cancel_awaiting_callback
from hivejobs.store.chains import suspend_chain_tries
from hivejobs.store.db import Conn, Database, db_now
from hivejobs.store.enqueue import (
    COPY_JOBS,
    COPY_TYPES,
    caller_savepoint,
    copy_rows,
    enqueue_plan,
    get_plan,
    insert_plan,
    notify_plan,
    owns_transaction,
    queued_pushes,
)
from hivejobs.store.sequence import Archived, claim_in_sequence, handed_over, number_copied
from hivejobs.store.sql import load_queries, run_plan

JOBS = load_queries("jobs.sql")


class Jobs(Database):
    """The live jobs' statements: owns no state; the rows and their fences are the truth."""

    # -- enqueue -----------------------------------------------------------------------

    def insert_job(self, job: NewJob, explicit_id: bool, conn: Conn | None = None) -> Inserted:
        """Insert unless the id exists (see enqueue.insert_plan); in `conn`'s transaction if
        given, where a queued job is dispatched by NOTIFY when (and only if) the caller
        commits. Otherwise the caller pushes the id to Redis."""
        if conn is None:
            with self.connection() as own:
                return _insert_own(own, job, explicit_id)
        if owns_transaction(conn):
            return _insert_own(conn, job, explicit_id)
        # A generated id is one INSERT; a caller's id or a unique window may take several
        # statements, undone together if one fails so that the caller's transaction stays
        # usable.
        single = not explicit_id and job.unique is None and job.debounce is None
        with nullcontext() if single else caller_savepoint(conn):
            return run_plan(conn, enqueue_plan(job, explicit_id, in_caller=True))

    def insert_many(self, jobs: Sequence[NewJob], conn: Conn | None = None) -> list[Push]:
        """COPY fresh jobs (generated ids, so no conflicts) in one transaction: the store's
        own, or `conn`'s. Returns the pushes for the caller to make; none in the caller's
        transaction, whose commit dispatches them (NOTIFY)."""
        with nullcontext(conn) if conn is not None else self.connection() as c:
            in_caller = conn is not None and not owns_transaction(c)
            with nullcontext() if in_caller else c.transaction():
                now = db_now(c)
                with c.cursor().copy(COPY_JOBS) as copy:
                    copy.set_types(COPY_TYPES)
                    for row in copy_rows(jobs, now):
                        copy.write_row(row)
                number_copied(c, jobs)
                pushes = queued_pushes(jobs, now)
                if not in_caller:
                    return pushes
                run_plan(c, notify_plan(pushes))
                return []

    # -- claim and finish --------------------------------------------------------------

    def claim_queued(
        self, ids: list[str], worker_id: str, conn: Conn, *, name: str, sequenced: bool = False
    ) -> list[ClaimedJob]:
        """Claim by primary key: Postgres never scans a queue under contention. Only jobs of
        type `name`: a pool never runs a job under another type's handler. A `sequenced`
        type's claim adds its keys' locks and guard (store/sequence.py)."""
        if sequenced:
            return claim_in_sequence(conn, ids, worker_id, name)
        cur = conn.cursor(row_factory=class_row(ClaimedJob))
        params = {"ids": ids, "worker_id": worker_id, "name": name}
        return cur.execute(JOBS["claim_queued"], params).fetchall()

    def foreign_ids(self, ids: list[str], name: str) -> list[JobRef]:
        """Those ids that are live jobs of a type other than `name`."""
        with self.connection() as conn:
            cur = conn.cursor(row_factory=class_row(JobRef))
            return cur.execute(JOBS["foreign_ids"], {"ids": ids, "name": name}).fetchall()

    def drop_archived_duplicate_if_running(self, job_id: str, claim_token: int) -> bool:
        """Remove our claim's live row if its id is already archived; True if it was."""
        with self.connection() as conn:
            params = {"id": job_id, "token": claim_token}
            return bool(conn.execute(JOBS["drop_archived_duplicate_if_running"], params).fetchall())

    def finish(self, done: Sequence[Completion], conn: Conn) -> tuple[int, list[Requeued]]:
        """Write one batch of finished claims in one transaction (group commit).

        Returns how many rows the fences let through, and the jobs put back in the queue or
        schedule, with the next jobs of the sequence keys the batch ended (handed over by the
        trigger); the caller pushes the ids of those queued to Redis.
        """
        archive = [c for c in done if c.outcome in ("succeeded", "failed", "cancelled")]
        requeue = [c for c in done if c.outcome in ("retry", "suspend")]
        suspends = [c for c in requeue if c.outcome == "suspend"]
        awaiting = [c for c in done if c.outcome == "await_callback"]
        written = 0
        requeued: list[Requeued] = []
        # One statement is atomic on its own: in autocommit it costs one round trip instead
        # of three (BEGIN, statement, COMMIT), which is every batch at low rates.
        single = not (archive and requeue) and not suspends and not awaiting
        with nullcontext() if single else conn.transaction():
            if awaiting:
                written += await_callbacks(conn, awaiting)
            if archive:
                ended = conn.cursor(row_factory=class_row(Archived))
                archived = ended.execute(
                    JOBS["archive_finished_if_running"],
                    {"ids": [c.id for c in archive], "rows": archive_rows(archive)},
                ).fetchall()
                written += len(archived)
            if requeue:
                if suspends:
                    # Chain tries end here (their chain is suspended); plain jobs requeue.
                    written += suspend_chain_tries(conn, suspends)
                cur = conn.cursor(row_factory=class_row(Requeued))
                requeued = cur.execute(
                    JOBS["requeue_if_running"],
                    {
                        "ids": [c.id for c in requeue],
                        "tokens": [c.claim_token for c in requeue],
                        "delays": [c.retry_delay_s for c in requeue],
                        "uncounts": [1 if c.outcome == "suspend" else 0 for c in requeue],
                        "errors": [_pg_text(c.error) for c in requeue],
                    },
                ).fetchall()
                written += len(requeued)
        if archive:
            # After the commit, so that a job is pushed only once it may be claimed.
            requeued += handed_over(conn, archived)
        return written, requeued

    def release_unstarted(self, ids: list[str], worker_id: str) -> list[Push]:
        """Claims whose COMMIT outcome was unknown go back unstarted (attempt uncounted)."""
        with self.connection() as conn:
            cur = conn.cursor(row_factory=class_row(Push))
            params = {"ids": ids, "worker_id": worker_id}
            return cur.execute(JOBS["release_unstarted_if_mine"], params).fetchall()

    def running_claims(self, worker_id: str) -> list[HeldClaim]:
        with self.connection() as conn:
            cur = conn.cursor(row_factory=class_row(HeldClaim))
            return cur.execute(JOBS["running_claims"], {"worker_id": worker_id}).fetchall()

    def release_claims(self, worker_id: str, claims: Sequence[tuple[str, int]]) -> list[Push]:
        """Claims a live pool no longer tracks go back to the queue, fenced by token and by
        the worker that still holds them."""
        params = {
            "ids": [c[0] for c in claims],
            "tokens": [c[1] for c in claims],
            "worker_id": worker_id,
        }
        with self.connection() as conn:
            cur = conn.cursor(row_factory=class_row(Push))
            return cur.execute(JOBS["release_claims_if_running"], params).fetchall()

    # -- reads and user actions ----------------------------------------------------------

    def get_row(self, job_id: str) -> dict[str, Any] | None:
        with self.connection() as conn:
            return run_plan(conn, get_plan(job_id))

    def cancel(self, job_id: str) -> str | None:
        """'cancelled', 'requested' (it runs: its pool is told), or None (not live)."""
        with self.connection() as conn, conn.transaction():
            if conn.execute(JOBS["cancel_waiting"], {"id": job_id}).fetchone():
                return "cancelled"
            if cancel_awaiting_callback(conn, job_id):
                return "cancelled"  # no process runs it: nobody to tell
            if conn.execute(JOBS["request_cancel_running"], {"id": job_id}).fetchone():
                return "requested"
        return None

    # -- job types -----------------------------------------------------------------------

    def upsert_job_types(self, types: Sequence[JobTypeInfo]) -> None:
        with self.connection() as conn, conn.transaction():
            for t in types:
                conn.execute(
                    JOBS["upsert_job_type"],
                    {
                        "name": t.name,
                        "concurrency": t.concurrency,
                        "processes": t.processes,
                        "attempts": t.attempts,
                        "delivery": t.delivery,
                        "timeout_s": t.timeout_s,
                        "callback": t.callback,
                        "callback_timeout_s": t.callback_timeout_s,
                        "sequence_by": t.sequence_by,
                        "on_failure": t.on_failure,
                    },
                )
                conn.execute(JOBS["set_fair_by"], {"name": t.name, "fair_by": t.fair_by})

    def job_types(self) -> list[JobTypeInfo]:
        with self.connection() as conn:
            cur = conn.cursor(row_factory=class_row(JobTypeInfo))
            return cur.execute(JOBS["list_job_types"]).fetchall()

    def type_counts(self) -> list[TypeCounts]:
        with self.connection() as conn:
            cur = conn.cursor(row_factory=class_row(TypeCounts))
            return cur.execute(JOBS["type_counts"]).fetchall()


class _Finished(msgspec.Struct, omit_defaults=True):
    """One row of archive_finished_if_running's JSON parameter (bytes encode as base64)."""

    id: str
    token: int
    final_state: str
    final_error: str | None = None
    final_result: bytes | None = None


_ROWS_ENCODER = msgspec.json.Encoder()


def archive_rows(archive: Sequence[Completion]) -> str:
    """archive_finished_if_running's `rows`: the batch's per-row values as one JSON text."""
    rows = [_Finished(c.id, c.claim_token, c.outcome, _pg_text(c.error), c.result) for c in archive]
    return _ROWS_ENCODER.encode(rows).decode()


def _pg_text(value: str | None) -> str | None:
    """Postgres text cannot hold NUL or a lone surrogate; an error message from user code
    might (the pool makes its errors storable first; this guards every other writer)."""
    if value is None:
        return None
    value = value.replace("\x00", "\\x00")
    try:
        value.encode()
    except UnicodeEncodeError:
        value = value.encode(errors="backslashreplace").decode()
    return value


def _insert_own(conn: Conn, job: NewJob, explicit_id: bool) -> Inserted:
    """The enqueue as its own transaction (the store's connection, or an autocommit one)."""
    # One statement: atomic on its own.
    if not explicit_id and job.unique is None and job.debounce is None:
        return run_plan(conn, insert_plan(job, False))
    with conn.transaction():
        return run_plan(conn, enqueue_plan(job, explicit_id, in_caller=False))
