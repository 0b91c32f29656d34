"""Waiting for a job's end (waits.sql, migration 0012): a LISTEN session per wait.

Part of store/: decides nothing. A `Watch` owns one connection of its own (LISTEN needs a
session: never a pooled one), listens on `hivejobs_done`, and registers a waiter row under a
lock on the job's live row, so the archiving transaction's trigger either sees the row and
NOTIFYs, or the job had already finished before the watch. Postgres stays the truth: a
wake-up only says "read the job again". This module builds nothing of the payload (the
trigger does) and parses it here alone (`names_job`).
"""

from __future__ import annotations

import uuid
from types import TracebackType
from typing import Any

import psycopg

from hivejobs.store.session_settings import connect_kwargs
from hivejobs.store.sql import load_queries

QUERIES = load_queries("waits.sql")


def names_job(payload: str, job_id: str) -> bool:
    """Whether a `hivejobs_done` payload may concern `job_id`: it lists the finished ids
    that had waiters, comma-separated, or is empty when the list was too long (any job)."""
    return payload == "" or job_id in payload.split(",")


class Watch:
    """A LISTEN session and a waiter row for one job, for one wait (a context manager)."""

    def __init__(self, url: str, job_id: str) -> None:
        self.job_id = job_id
        self.waiter = str(uuid.uuid4())
        self.conn: psycopg.Connection[Any] = psycopg.connect(url, **connect_kwargs(False, None))
        self.conn.execute(QUERIES["listen_done"])
        self.conn.execute(QUERIES["watch_job"], {"id": job_id, "waiter": self.waiter})

    def woken(self, timeout_s: float) -> bool:
        """Block until a NOTIFY may concern the job (True) or `timeout_s` passes (False)."""
        for note in self.conn.notifies(timeout=timeout_s):
            if names_job(note.payload, self.job_id):
                return True
        return False

    def __enter__(self) -> Watch:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            self.conn.execute(QUERIES["unwatch_job"], {"id": self.job_id, "waiter": self.waiter})
        except psycopg.Error:
            pass  # a dead session: its row goes with the next unwatch a day later
        finally:
            self.conn.close()


class AsyncWatch:
    """`Watch` for event loops (psycopg's AsyncConnection): open with `await AsyncWatch.open`."""

    def __init__(self, conn: psycopg.AsyncConnection[Any], job_id: str, waiter: str) -> None:
        self.conn, self.job_id, self.waiter = conn, job_id, waiter

    @classmethod
    async def open(cls, url: str, job_id: str) -> AsyncWatch:
        conn = await psycopg.AsyncConnection.connect(url, **connect_kwargs(False, None))
        waiter = str(uuid.uuid4())
        await conn.execute(QUERIES["listen_done"])
        await conn.execute(QUERIES["watch_job"], {"id": job_id, "waiter": waiter})
        return cls(conn, job_id, waiter)

    async def woken(self, timeout_s: float) -> bool:
        async for note in self.conn.notifies(timeout=timeout_s):
            if names_job(note.payload, self.job_id):
                return True
        return False

    async def close(self) -> None:
        try:
            await self.conn.execute(
                QUERIES["unwatch_job"], {"id": self.job_id, "waiter": self.waiter}
            )
        except psycopg.Error:
            pass  # a dead session: its row goes with the next unwatch a day later
        finally:
            await self.conn.close()
