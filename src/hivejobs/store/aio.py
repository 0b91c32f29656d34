"""The store's enqueue and read statements on an async connection pool, for async web apps.

The same statements as the sync Store (store/enqueue.py writes them once, as steps); only
the I/O is awaited. Never commits, rolls back or closes a caller's connection.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from datetime import datetime
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from hivejobs.errors import ConnectionFailed
from hivejobs.records.dispatch import Push
from hivejobs.records.events import JobEvent
from hivejobs.records.jobs import Inserted, NewJob
from hivejobs.store.chains import create_chain_plan
from hivejobs.store.db import SCHEMA
from hivejobs.store.enqueue import (
    COPY_JOBS,
    COPY_TYPES,
    acaller_savepoint,
    copy_rows,
    enqueue_plan,
    get_plan,
    insert_plan,
    notify_plan,
    owns_transaction,
    queued_pushes,
)
from hivejobs.store.migrate import schema_check_plan
from hivejobs.store.progress import progress_plan
from hivejobs.store.sequence import SEQ, copied_params
from hivejobs.store.session_settings import connect_kwargs
from hivejobs.store.sql import arun_plan
from hivejobs.urls import redact_url

AsyncConn = psycopg.AsyncConnection[Any]


class AsyncStore:
    """An AsyncConnectionPool and the statements an async client needs.

    Owns the pool, which belongs to the event loop that opened it (asyncio objects cannot
    cross loops): the App keeps one AsyncStore per loop.
    """

    def __init__(self, pool: AsyncConnectionPool[AsyncConn]) -> None:
        self._pool = pool

    @classmethod
    async def open(cls, url: str, max_size: int = 4, pooled: bool = False) -> AsyncStore:
        """Open the pool, failing in seconds with a clear error, and check the schema."""
        pool: AsyncConnectionPool[AsyncConn] = AsyncConnectionPool(
            url,
            min_size=1,
            max_size=max_size,
            kwargs=connect_kwargs(pooled, None),
            open=False,
            name="hivejobs-async",
            timeout=5.0,
        )
        try:
            await pool.open(wait=True, timeout=10.0)
        except PoolTimeout:
            await pool.close()
            raise ConnectionFailed("Postgres", redact_url(url), "no connection in 10 s") from None
        store = cls(pool)
        async with pool.connection() as conn:
            await arun_plan(conn, schema_check_plan())
        return store

    async def close(self) -> None:
        await self._pool.close()

    def connection(self) -> AbstractAsyncContextManager[AsyncConn]:
        """A connection of the pool, for the statements of other aggregates (batches)."""
        return self._pool.connection()

    async def insert_job(
        self, job: NewJob, explicit_id: bool, conn: AsyncConn | None = None
    ) -> Inserted:
        """As Store.insert_job: in `conn`'s transaction, dispatched by NOTIFY on commit."""
        if conn is None:
            async with self._pool.connection() as own:
                return await _insert_own(own, job, explicit_id)
        if owns_transaction(conn):
            return await _insert_own(conn, job, explicit_id)
        if not explicit_id and job.unique is None and job.debounce is None:
            return await arun_plan(conn, enqueue_plan(job, False, in_caller=True))
        async with acaller_savepoint(conn):
            return await arun_plan(conn, enqueue_plan(job, True, in_caller=True))

    async def insert_many(self, jobs: list[NewJob], conn: AsyncConn | None = None) -> list[Push]:
        """As Store.insert_many: COPY in one transaction; the pushes left for the caller."""
        if conn is None:
            async with self._pool.connection() as own, own.transaction():
                return await _copy_jobs(own, jobs)
        if owns_transaction(conn):
            async with conn.transaction():
                return await _copy_jobs(conn, jobs)
        pushes = await _copy_jobs(conn, jobs)
        await arun_plan(conn, notify_plan(pushes))
        return []

    async def get_row(self, job_id: str) -> dict[str, Any] | None:
        async with self._pool.connection() as conn:
            return await arun_plan(conn, get_plan(job_id))

    async def get_progress(self, job_id: str) -> JobEvent | None:
        """The job's last stored progress (store/progress.py), None if it reported none."""
        async with self._pool.connection() as conn:
            return await arun_plan(conn, progress_plan(job_id))

    async def create_chain(
        self,
        chain: dict[str, Any],
        jobs: list[dict[str, Any]],
        sequences: list[dict[str, Any]],
        conn: AsyncConn | None = None,
    ) -> None:
        plan = create_chain_plan(chain, jobs, sequences)
        if conn is None:
            async with self._pool.connection() as own, own.transaction():
                await arun_plan(own, plan)
        elif owns_transaction(conn):
            async with conn.transaction():
                await arun_plan(conn, plan)
        else:
            async with acaller_savepoint(conn):
                await arun_plan(conn, plan)


async def _insert_own(conn: AsyncConn, job: NewJob, explicit_id: bool) -> Inserted:
    # One statement: atomic on its own.
    if not explicit_id and job.unique is None and job.debounce is None:
        return await arun_plan(conn, insert_plan(job, False))
    async with conn.transaction():
        return await arun_plan(conn, enqueue_plan(job, explicit_id, in_caller=False))


async def _copy_jobs(conn: AsyncConn, jobs: list[NewJob]) -> list[Push]:
    cur = await conn.execute(SCHEMA["db_now"])
    row = await cur.fetchone()
    assert row is not None  # SELECT now() returns one row
    now: datetime = row[0]
    async with conn.cursor().copy(COPY_JOBS) as copy:
        copy.set_types(COPY_TYPES)
        for values in copy_rows(jobs, now):
            await copy.write_row(values)
    keyed = [j for j in jobs if j.seq_key is not None]
    if keyed:
        await conn.execute(SEQ["sequence_copied"], copied_params(keyed))
    return queued_pushes(jobs, now)
