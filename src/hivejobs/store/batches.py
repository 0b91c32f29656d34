"""Batches in Postgres: create, add jobs, seal, read. SQL in batch_queries.sql; the counting
trigger and the callback decision in migrations/0018_batches.sql.

Adding jobs is one transaction (the store's own, or the caller's under a savepoint): store
the jobs, then lock the batch row, check that it takes them, record them as members and
raise the counters. The jobs cannot end before that transaction commits (nobody sees them),
so the lock is taken last: it is held for the counters' update and the commit only, not for
the COPY of 10,000 jobs, during which the batch's running jobs could not end. A refusal
rolls the jobs back with the rest. Never decides who may add: the caller says who adds
(`adder`, a running member's job id, or None) and the guard here refuses what the batch's
state forbids.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.rows import dict_row

from hivejobs.errors import BatchClosed, BatchNotFound
from hivejobs.records.batches import BatchFailure, BatchState, BatchStatus
from hivejobs.records.dispatch import Push
from hivejobs.records.jobs import Inserted, NewJob
from hivejobs.serialization import decode_json
from hivejobs.store.db import SCHEMA, db_now
from hivejobs.store.enqueue import (
    COPY_JOBS,
    COPY_TYPES,
    acaller_savepoint,
    caller_savepoint,
    copy_rows,
    enqueue_plan,
    notify_plan,
    owns_transaction,
    queued_pushes,
)
from hivejobs.store.sql import Steps, arun_plan, load_queries, run_plan

if TYPE_CHECKING:
    from hivejobs.store import Store
    from hivejobs.store.aio import AsyncStore

Conn = psycopg.Connection[Any]
AsyncConn = psycopg.AsyncConnection[Any]
QUERIES = load_queries("batch_queries.sql")
FAILURES_SHOWN = 1000


# -- plans: the statements, run alike on a sync or an async connection ------------------------


def lock_plan(batch_id: str, adder: str | None) -> Steps[None]:
    """Lock the batch for an add, or raise what forbids it (the transaction then stores
    nothing: the caller rolls back, the jobs stored before this with it)."""
    row = yield QUERIES["lock_batch_for_add"], {"id": batch_id, "adder": adder}
    if row is None:
        raise BatchNotFound(batch_id)
    sealed, completed, adder_live = row
    if completed:
        raise BatchClosed(batch_id, "complete")
    # A sealed batch with a live member cannot complete before that member ends, and the
    # member's own add commits before it ends: so its jobs are counted in time.
    if sealed and not adder_live:
        raise BatchClosed(batch_id, "sealed")


def add_one_plan(
    batch_id: str, adder: str | None, job: NewJob, explicit_id: bool, in_caller: bool
) -> Steps[Inserted]:
    """One job: a duplicate in a unique window or an existing id is not made a member."""
    inserted = yield from enqueue_plan(job, explicit_id, in_caller)
    yield from lock_plan(batch_id, adder)
    if inserted.created:
        yield QUERIES["add_members"], {"id": batch_id, "ids": [job.id]}
    return inserted


def members_plan(batch_id: str, jobs: Sequence[NewJob]) -> Steps[None]:
    yield QUERIES["add_members"], {"id": batch_id, "ids": [j.id for j in jobs]}


def seal_plan(batch_id: str) -> Steps[bool]:
    """Seal (idempotent), then complete the batch if its jobs have all ended already."""
    row = yield QUERIES["seal_batch"], {"id": batch_id}
    if row is None:
        exists = yield QUERIES["batch_exists"], {"id": batch_id}
        if exists is None:
            raise BatchNotFound(batch_id)
        return False
    yield QUERIES["finish_batch_if_done"], {"id": batch_id}
    return True


class BatchStore:
    """The batch statements over a Store's pool (or a caller's connection); owns no state."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def create(self, params: dict[str, Any], conn: Conn | None = None) -> None:
        with self._transaction(conn) as c:
            c.execute(QUERIES["create_batch"], params)

    def add_one(
        self, batch_id: str, adder: str | None, job: NewJob, explicit_id: bool, conn: Conn | None
    ) -> Inserted:
        in_caller = conn is not None and not owns_transaction(conn)
        with self._transaction(conn) as c:
            return run_plan(c, add_one_plan(batch_id, adder, job, explicit_id, in_caller))

    def add_many(
        self, batch_id: str, adder: str | None, jobs: Sequence[NewJob], conn: Conn | None
    ) -> list[Push]:
        """COPY the jobs in; the pushes are the caller's to make (none in a caller's
        transaction, whose commit dispatches them by NOTIFY)."""
        in_caller = conn is not None and not owns_transaction(conn)
        with self._transaction(conn) as c:
            now = db_now(c)
            with c.cursor().copy(COPY_JOBS) as copy:
                copy.set_types(COPY_TYPES)
                for row in copy_rows(jobs, now):
                    copy.write_row(row)
            run_plan(c, lock_plan(batch_id, adder))
            run_plan(c, members_plan(batch_id, jobs))
            pushes = queued_pushes(jobs, now)
            if not in_caller:
                return pushes
            run_plan(c, notify_plan(pushes))
            return []

    def seal(self, batch_id: str, conn: Conn | None = None) -> bool:
        with self._transaction(conn) as c:
            return run_plan(c, seal_plan(batch_id))

    def batch_of_job(self, job_id: str) -> str | None:
        with self.store.connection() as c:
            row = c.execute(QUERIES["batch_of_job"], {"id": job_id}).fetchone()
        return None if row is None else str(row[0])

    def status(self, batch_id: str, failures: int = FAILURES_SHOWN) -> BatchStatus | None:
        with self.store.connection() as c:
            row = c.cursor(row_factory=dict_row).execute(QUERIES["get_batch"], {"id": batch_id})
            found = row.fetchone()
            if found is None:
                return None
            params = {"id": batch_id, "limit": failures}
            failed = c.execute(QUERIES["failed_members"], params).fetchall()
        return batch_status(
            found, [BatchFailure(job_id=r[0], name=r[1], state=r[2]) for r in failed]
        )

    def recent(self, limit: int = 50) -> list[BatchStatus]:
        with self.store.connection() as c:
            cur = c.cursor(row_factory=dict_row)
            rows = cur.execute(QUERIES["recent_batches"], {"limit": limit}).fetchall()
        return [batch_status(r, []) for r in rows]

    @contextmanager
    def _transaction(self, conn: Conn | None) -> Iterator[Conn]:
        """The store's own transaction, an autocommit connection's, or a savepoint in the
        caller's (never committed here: only the caller's COMMIT makes the jobs real)."""
        if conn is None:
            with self.store.connection() as own, own.transaction():
                yield own
        elif owns_transaction(conn):
            with conn.transaction():
                yield conn
        else:
            with caller_savepoint(conn):
                yield conn


class AsyncBatchStore:
    """BatchStore's writes on an async pool (or a caller's async connection)."""

    def __init__(self, store: AsyncStore) -> None:
        self.store = store

    async def create(self, params: dict[str, Any], conn: AsyncConn | None = None) -> None:
        async with self._transaction(conn) as c:
            await c.execute(QUERIES["create_batch"], params)

    async def add_one(
        self,
        batch_id: str,
        adder: str | None,
        job: NewJob,
        explicit_id: bool,
        conn: AsyncConn | None,
    ) -> Inserted:
        in_caller = conn is not None and not owns_transaction(conn)
        async with self._transaction(conn) as c:
            plan = add_one_plan(batch_id, adder, job, explicit_id, in_caller)
            return await arun_plan(c, plan)

    async def add_many(
        self, batch_id: str, adder: str | None, jobs: Sequence[NewJob], conn: AsyncConn | None
    ) -> list[Push]:
        in_caller = conn is not None and not owns_transaction(conn)
        async with self._transaction(conn) as c:
            cur = await c.execute(SCHEMA["db_now"])
            row = await cur.fetchone()
            assert row is not None  # SELECT now() returns one row
            async with c.cursor().copy(COPY_JOBS) as copy:
                copy.set_types(COPY_TYPES)
                for values in copy_rows(jobs, row[0]):
                    await copy.write_row(values)
            await arun_plan(c, lock_plan(batch_id, adder))
            await arun_plan(c, members_plan(batch_id, jobs))
            pushes = queued_pushes(jobs, row[0])
            if not in_caller:
                return pushes
            await arun_plan(c, notify_plan(pushes))
            return []

    async def seal(self, batch_id: str, conn: AsyncConn | None = None) -> bool:
        async with self._transaction(conn) as c:
            return await arun_plan(c, seal_plan(batch_id))

    @asynccontextmanager
    async def _transaction(self, conn: AsyncConn | None) -> AsyncIterator[AsyncConn]:
        if conn is None:
            async with self.store.connection() as own, own.transaction():
                yield own
        elif owns_transaction(conn):
            async with conn.transaction():
                yield conn
        else:
            async with acaller_savepoint(conn):
                yield conn


def prune_batches(store: Store, retention_s: float, limit: int = 1000) -> int:
    """Delete up to `limit` batches complete for longer than `retention_s`; how many."""
    with store.connection() as c:
        params = {"retention_s": retention_s, "limit": limit}
        row = c.execute(QUERIES["prune_completed_batches"], params).fetchone()
    return 0 if row is None else int(row[0])


def batch_status(row: dict[str, Any], failures: list[BatchFailure]) -> BatchStatus:
    state: BatchState = "complete" if row["completed_at"] else "sealed" if row["sealed"] else "open"
    fields = {k: v for k, v in row.items() if k not in ("sealed", "data")}
    return BatchStatus(
        **fields, state=state, data=decode_json(bytes(row["data"])), failures=failures
    )
