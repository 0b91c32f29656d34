"""Leader-only upkeep of the job table (maintenance.sql): promote due jobs, end jobs that can
no longer start, find queued ids Redis may have lost, measure queues, compact the hot table,
prune the archive.

Every write here that changes job state is a guarded verb (`..._if_leader`): it runs in a
transaction under the coordinator lease and returns None, writing nothing, once the lease is
lost (rule R7 in docs/concepts/reliability.md). Decides nothing: the coordinator's services
decide when and how much.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import psycopg.sql
from psycopg.rows import class_row

from hivejobs.records.dispatch import KeyedQueued, Lease, OldestQueued, Push, QueuedEntry
from hivejobs.store.db import Conn, connect
from hivejobs.store.leases import Leases
from hivejobs.store.sql import load_queries

UPKEEP = load_queries("maintenance.sql")
EPOCH = datetime(1970, 1, 1).astimezone()


class Maintenance(Leases):
    """The coordinator's statements over the job table; owns no state."""

    # -- guarded verbs: None when the lease is lost --------------------------------------

    def promote_due_if_leader(self, lease: Lease, limit: int) -> list[Push] | None:
        """Due scheduled jobs (and retries whose backoff passed) become queued."""
        if self.nothing_to_write(UPKEEP["any_due"]):
            return []
        with self.leader_transaction(lease) as conn:
            return None if conn is None else _pushes(conn, "promote_due", {"limit": limit})

    def end_waiting_if_leader(self, lease: Lease, limit: int) -> int | None:
        """Archive waiting jobs that can no longer start (expired, or cancelled while a retry
        waited); how many."""
        if self.nothing_to_write(UPKEEP["any_waiting_ended"]):
            return 0
        with self.leader_transaction(lease) as conn:
            if conn is None:
                return None
            return len(conn.execute(UPKEEP["end_waiting_jobs"], {"limit": limit}).fetchall())

    def stale_queued_if_leader(
        self,
        lease: Lease,
        queue: tuple[str, int],
        grace_s: float,
        limit: int,
        before: datetime | None = None,
    ) -> list[Push] | None:
        """Up to `limit` of one queue's ids queued more than `grace_s` before `before` (or
        before now), oldest first, re-stamped queued now (so a list Redis refuses is tried
        again after the grace)."""
        params = {
            "name": queue[0],
            "priority": queue[1],
            "grace_s": grace_s,
            "before": before,
            "limit": limit,
        }
        with self.leader_transaction(lease) as conn:
            return None if conn is None else _pushes(conn, "stale_queued", params)

    def restamp_queued_if_leader(self, lease: Lease, ids: Sequence[str]) -> list[Push] | None:
        """These ids, those still queued, re-stamped queued now for a push again, in the
        order given (a key's ids keep their order through the inbox)."""
        with self.leader_transaction(lease) as conn:
            if conn is None:
                return None
            pushes = {p.id: p for p in _pushes(conn, "restamp_queued", {"ids": list(ids)})}
        return [pushes[i] for i in ids if i in pushes]

    # -- hivejobs.testing (no coordinator runs there) ------------------------------------

    def promote_due_unleased(self, limit: int) -> list[Push]:
        """promote_due without the coordinator's lease: for hivejobs.testing, where no
        coordinator runs."""
        with self.connection() as conn:
            return _pushes(conn, "promote_due", {"limit": limit})

    def advance_scheduled_if_testing(self, every: bool) -> int:
        """Make scheduled jobs due now (all, or only retries): hivejobs.testing.drain."""
        with self.connection() as conn:
            rows = conn.execute(UPKEEP["advance_scheduled_if_testing"], {"every": every})
            return len(rows.fetchall())

    # -- reads -----------------------------------------------------------------------------

    def oldest_queued(self, grace_s: float) -> list[OldestQueued]:
        """Each queue's oldest queued row: an index entry or two per queue read."""
        with self.connection() as conn:
            cur = conn.cursor(row_factory=class_row(OldestQueued))
            return cur.execute(UPKEEP["oldest_queued"], {"grace_s": grace_s}).fetchall()

    def queued_at_of(self, ids: list[str]) -> dict[str, datetime]:
        """When each of these ids was queued, for those still queued."""
        with self.connection() as conn:
            rows = conn.execute(UPKEEP["queued_at_of"], {"ids": ids}).fetchall()
        return {str(r[0]): r[1] for r in rows if r[1] is not None}

    def fair_fields(self) -> dict[str, str]:
        """Fair type -> its fair_by payload field, as its workers declared it."""
        with self.connection() as conn:
            return {str(r[0]): str(r[1]) for r in conn.execute(UPKEEP["fair_fields"])}

    def oldest_queued_keyed(
        self,
        queue: tuple[str, int],
        field: str,
        grace_s: float,
        after: tuple[datetime, str] | None,
        limit: int,
    ) -> list[KeyedQueued]:
        """A fair queue's oldest queued rows after `after` (queued_at, id), with their keys."""
        after_at, after_id = after or (EPOCH, "")
        params = {
            "name": queue[0],
            "priority": queue[1],
            "field": field,
            "grace_s": grace_s,
            "after_at": after_at,
            "after_id": after_id,
            "limit": limit,
        }
        with self.connection() as conn:
            cur = conn.cursor(row_factory=class_row(KeyedQueued))
            return cur.execute(UPKEEP["oldest_queued_keyed"], params).fetchall()

    def queued_counts(self) -> dict[tuple[str, int], int]:
        """Queued jobs per (type, priority): one entry per Redis list."""
        with self.connection() as conn:
            rows = conn.execute(UPKEEP["queued_counts"]).fetchall()
        return {(str(r[0]), int(r[1])): int(r[2]) for r in rows}

    def running_counts(self) -> dict[str, int]:
        with self.connection() as conn:
            rows = conn.execute(UPKEEP["running_counts"]).fetchall()
        return {str(r[0]): int(r[1]) for r in rows}

    def queued_page(
        self, queue: tuple[str, int], after: tuple[datetime, str] | None, limit: int
    ) -> list[QueuedEntry]:
        """One queue's queued jobs after `after` (queued_at, id), oldest first."""
        after_at, after_id = after or (EPOCH, "")
        params = {
            "name": queue[0],
            "priority": queue[1],
            "after_at": after_at,
            "after_id": after_id,
            "limit": limit,
        }
        with self.connection() as conn:
            cur = conn.cursor(row_factory=class_row(QueuedEntry))
            return cur.execute(UPKEEP["queued_page"], params).fetchall()

    def boot_marker_recorded(self, prefix: str) -> bool:
        """Whether a boot marker was ever set under this Redis prefix: tells a flushed Redis
        from a first start, which look the same from Redis."""
        with self.connection() as conn:
            row = conn.execute(UPKEEP["boot_marker_recorded"], {"prefix": prefix}).fetchone()
        return bool(row and row[0])

    def hot_table_size(self, cap: int) -> tuple[int, int]:
        """(live rows, counted up to `cap`; total bytes of the hot table and its indexes)."""
        with self.connection() as conn:
            row = conn.execute(UPKEEP["hot_table_size"], {"cap": cap}).fetchone()
        assert row is not None  # an aggregate: always one row
        return int(row[0]), int(row[1])

    # -- writes that need no lease (idempotent, or not job state) ------------------------

    def record_boot_marker(self, prefix: str, marker: str) -> None:
        with self.connection() as conn:
            conn.execute(UPKEEP["record_boot_marker"], {"prefix": prefix, "marker": marker})

    def set_gauges(self, values: Sequence[tuple[str, str, int]]) -> None:
        with self.connection() as conn, conn.transaction():
            for name, queue, value in values:
                conn.execute(UPKEEP["set_gauge"], {"name": name, "queue": queue, "value": value})

    def compact_hot_table(self, timeout_s: float = 300.0) -> None:
        """Give a drained hot table's space back: VACUUM truncates the empty heap, REINDEX
        CONCURRENTLY rebuilds the indexes (VACUUM only marks their pages reusable). Both run
        online, beside enqueues and claims, on a connection of their own without the
        coordinator's lock timeout; leftovers of an interrupted earlier run are dropped."""
        # Behind a pooler no statement_timeout: a session SET would outlive us on a server
        # connection that other clients get next, and VACUUM cannot run in a transaction.
        options = (
            {} if self.pooled else {"options": f"-c statement_timeout={int(timeout_s * 1000)}"}
        )
        with connect(self.url, self.pooled, **options) as conn:
            for (name,) in conn.execute(UPKEEP["invalid_hot_indexes"]).fetchall():
                drop = psycopg.sql.SQL(UPKEEP["drop_invalid_index"])
                conn.execute(drop.format(index=psycopg.sql.SQL(name)))
            conn.execute(UPKEEP["vacuum_hot_table"])
            conn.execute(UPKEEP["reindex_hot_table"])

    def prune_archive(self, retention_s: float) -> int:
        """One batch of archived jobs older than `retention_s`, whatever their type (the
        coordinator prunes per type: store/archive.py prune_archive)."""
        with self.connection() as conn:
            cur = conn.execute(UPKEEP["prune_archive"], {"retention_s": retention_s})
            conn.execute(UPKEEP["prune_unique"])  # unique windows that have passed
            return cur.rowcount


def _pushes(conn: Conn, query: str, params: dict[str, object]) -> list[Push]:
    cur = conn.cursor(row_factory=class_row(Push))
    return cur.execute(UPKEEP[query], params).fetchall()
