"""Worker processes (workers.sql): registration, heartbeats, and the rescue of the claims of
processes that died.

A worker identity is a fresh UUID per process start (rule R4 in docs/concepts/reliability.md),
and liveness is judged on the database clock (R5). Decides nothing: the coordinator's
Rescuer and the supervisor decide whose claims to release and when.
"""

from __future__ import annotations

import uuid

from psycopg.rows import class_row

from hivejobs.records.dispatch import JobRef, Lease, Push, Rescued
from hivejobs.records.fleet import WorkerInfo
from hivejobs.store.db import Database
from hivejobs.store.leases import hold_lease
from hivejobs.store.sql import load_queries

WORKERS = load_queries("workers.sql")


def new_worker_id() -> str:
    """A fresh identity for every process start (R4: never a host name or a reused id)."""
    return str(uuid.uuid4())


class Workers(Database):
    """The worker table's statements; owns no state (the heartbeat rows are the truth)."""

    def register_worker(
        self, worker_id: str, host: str, pid: int, role: str, pool: str | None
    ) -> None:
        with self.connection() as conn:
            conn.execute(
                WORKERS["register_worker"],
                {"id": worker_id, "host": host, "pid": pid, "role": role, "pool": pool},
            )

    def heartbeat(self, worker_id: str) -> bool:
        """False when the row is gone: the coordinator declared this process dead."""
        with self.connection() as conn:
            return conn.execute(WORKERS["heartbeat"], {"id": worker_id}).fetchone() is not None

    def heartbeat_all(self, worker_ids: list[str]) -> bool:
        """One heartbeat for the worker rows of a process (one per job type it runs); False
        when any is gone: the coordinator declared the process dead."""
        with self.connection() as conn:
            rows = conn.execute(WORKERS["heartbeat_all"], {"ids": worker_ids}).fetchall()
        return len(rows) == len(set(worker_ids))

    def deregister_worker(self, worker_id: str) -> None:
        with self.connection() as conn:
            conn.execute(WORKERS["deregister_worker"], {"id": worker_id})

    def workers(self) -> list[WorkerInfo]:
        with self.connection() as conn:
            cur = conn.cursor(row_factory=class_row(WorkerInfo))
            return cur.execute(WORKERS["list_workers"]).fetchall()

    def live_pools(self, stuck_after_s: float) -> dict[str, int]:
        """Pool processes per job type whose heartbeat is younger than `stuck_after_s` (an
        older one is a dead process, as the Rescuer judges it)."""
        live: dict[str, int] = {}
        for w in self.workers():
            if w.role == "pool" and w.pool and w.heartbeat_age_s < stuck_after_s:
                live[w.pool] = live.get(w.pool, 0) + 1
        return live

    def find_dead_workers(self, stuck_after_s: float) -> list[str]:
        with self.connection() as conn:
            rows = conn.execute(
                WORKERS["find_dead_workers"], {"stuck_after_s": stuck_after_s}
            ).fetchall()
        return [str(r[0]) for r in rows]

    def running_of_workers(self, worker_ids: list[str]) -> list[JobRef]:
        """The jobs these workers run, longest-running first (at most 100)."""
        with self.connection() as conn:
            cur = conn.cursor(row_factory=class_row(JobRef))
            return cur.execute(WORKERS["running_of_workers"], {"worker_ids": worker_ids}).fetchall()

    def rescue_workers(
        self, worker_ids: list[str], poison_after: int, lease: Lease | tuple[str, int] | None = None
    ) -> Rescued | None:
        """Release the claims of dead processes: requeue (attempt counted) or fail.

        With `lease` (holder, term) the write happens only while that term holds (R7);
        None when it does not.
        """
        params = {"worker_ids": worker_ids, "poison_after": poison_after}
        with self.connection() as conn, conn.transaction():
            if lease is not None and not hold_lease(conn, lease):
                return None
            duplicates = conn.execute(WORKERS["rescue_drop_archived_duplicates"], params)
            dropped = [str(r[0]) for r in duplicates.fetchall()]
            cur = conn.cursor(row_factory=class_row(Push))
            requeued = cur.execute(WORKERS["rescue_requeue"], params).fetchall()
            failed = conn.execute(WORKERS["rescue_fail"], params).fetchall()
            conn.execute(WORKERS["delete_workers"], {"worker_ids": worker_ids})
        return Rescued(requeued=requeued, failed=len(failed), archived_duplicates=dropped)
