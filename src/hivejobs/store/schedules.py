"""Schedule statements (schedule_queries.sql): declare, list, and enqueue due ticks.

Part of store/: decides nothing. The coordinator's Scheduler hands in the jobs of the ticks
it computed; they are written, with the tick reached, in one transaction under the lease.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from psycopg.rows import class_row

from hivejobs.records.dispatch import Lease, Push
from hivejobs.records.fleet import Schedule, ScheduleState
from hivejobs.records.jobs import NewJob
from hivejobs.store.db import db_now
from hivejobs.store.enqueue import insert_plan
from hivejobs.store.leases import hold_lease
from hivejobs.store.sql import load_queries, run_plan

if TYPE_CHECKING:
    from hivejobs.store import Store

QUERIES = load_queries("schedule_queries.sql")


class ScheduleStore:
    """The schedule table, over the Store's connection pool."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def declare(self, job_types: Sequence[str], schedules: Sequence[Schedule]) -> None:
        """What an app declares at `hivejobs run`: its schedules replace the earlier ones of
        its own job types (a schedule removed from the code stops)."""
        with self.store.connection() as conn, conn.transaction():
            conn.execute(
                QUERIES["drop_undeclared_schedules"],
                {"job_types": list(job_types), "names": [s.name for s in schedules]},
            )
            for s in schedules:
                conn.execute(
                    QUERIES["upsert_schedule"],
                    {
                        "name": s.name,
                        "job_type": s.job_type,
                        "cron": s.cron,
                        "tz": s.tz,
                        "payload": s.payload,
                        "priority": s.priority,
                        "catch_up": s.catch_up,
                    },
                )

    def states(self) -> list[ScheduleState]:
        with self.store.connection() as conn:
            cur = conn.cursor(row_factory=class_row(ScheduleState))
            return cur.execute(QUERIES["list_schedules"]).fetchall()

    def now(self) -> datetime:
        with self.store.connection() as conn:
            return db_now(conn)

    def clock(self, lease: Lease) -> tuple[datetime, datetime | None]:
        """The database's time, and since when `lease` has been held (None: it is not)."""
        with self.store.connection() as conn:
            row = conn.execute(
                QUERIES["schedule_clock"], {"holder": lease[0], "term": lease[1]}
            ).fetchone()
        assert row is not None  # a SELECT without FROM returns its one row
        return row[0], row[1]

    def enqueue_ticks_if_leader(
        self, lease: Lease, state: ScheduleState, jobs: Sequence[NewJob], tick: datetime
    ) -> list[Push] | None:
        """Insert the ticks' jobs and advance the schedule to `tick`, atomically, while the
        lease holds; None when it does not. Nothing is written when another coordinator moved
        the schedule on since `state` was read (its next pass recomputes)."""
        with self.store.connection() as conn, conn.transaction():
            if not hold_lease(conn, lease):
                return None
            row = conn.execute(QUERIES["lock_schedule"], {"name": state.name}).fetchone()
            if row is None or row[0] != state.last_tick:
                return []
            pushes: list[Push] = []
            for job in jobs:
                inserted = run_plan(conn, insert_plan(job, explicit_id=True))
                if inserted.created and inserted.state == "queued":
                    pushes.append(Push(job.id, job.name, job.priority))
            conn.execute(QUERIES["advance_schedule"], {"name": state.name, "tick": tick})
            return pushes
