"""Sequence statements (sequence.sql; schema and hand-over in migrations 0017, 0023, 0024).

Part of store/: decides nothing. sequence.py says what a sequence guarantees; this module
numbers a key's jobs at enqueue, claims a sequenced type's jobs under their keys' locks with
the guard that keeps one job of a key running, in order, finds the jobs a completion batch
handed its keys to, reads and releases holds, and prunes idle keys' counters.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

import msgspec
import psycopg
from psycopg.rows import class_row

from hivejobs.records.dispatch import Requeued
from hivejobs.records.jobs import ClaimedJob, NewJob
from hivejobs.store.sql import load_queries

if TYPE_CHECKING:
    from hivejobs.store import Store

SEQ = load_queries("sequence.sql")
Conn = psycopg.Connection[Any]


class KeyState(msgspec.Struct, frozen=True, kw_only=True):
    """One key of a sequenced type: its live jobs, the one whose turn it is, and its hold
    (a job failed for good under on_failure="hold") with that job's last error."""

    key: str
    queued: int
    scheduled: int
    running: int
    next_id: str | None
    held_by: str | None
    held_error: str | None
    held_at: datetime | None


def claim_in_sequence(conn: Conn, ids: list[str], worker_id: str, name: str) -> list[ClaimedJob]:
    """Claim under the popped keys' locks: a job starts only if it is its key's next and
    nothing of its key runs or holds it. The ids refused for their key are parked (out of
    Redis until their key's hand-over). A savepoint inside a caller's transaction (the
    limited claim's), a transaction of its own otherwise."""
    params = {"ids": ids, "worker_id": worker_id, "name": name}
    with conn.transaction():
        conn.execute(SEQ["lock_keys"], params)
        cur = conn.cursor(row_factory=class_row(ClaimedJob))
        jobs = cur.execute(SEQ["claim_in_sequence"], params).fetchall()
        if len(jobs) < len(ids):
            claimed = {j.id for j in jobs}
            rest = [i for i in ids if i not in claimed]
            conn.execute(SEQ["park_waiting"], {"ids": rest, "name": name})
        return jobs


class Archived(msgspec.Struct, frozen=True):
    """A row the completer archived: its key (None: not sequenced) and its transaction's
    now(), the queued_at the hand-over trigger gave the key's next job."""

    id: str
    name: str
    seq_key: str | None
    at: datetime


def handed_over(conn: Conn, archived: Sequence[Archived]) -> list[Requeued]:
    """The jobs the hand-over trigger unparked when `archived` left the live table, as
    queued Requeued rows for the completer to push (none when nothing was sequenced: no
    round trip then)."""
    keyed = [a for a in archived if a.seq_key is not None]
    if not keyed:
        return []
    params = {
        "names": [a.name for a in keyed],
        "keys": [a.seq_key for a in keyed],
        "at": keyed[0].at,
    }
    try:
        cur = conn.cursor(row_factory=class_row(Requeued))
        return cur.execute(SEQ["handed_over_at"], params).fetchall()
    except psycopg.OperationalError:
        # The batch is committed: retrying it would find its claims ended and push nothing.
        # The unparked jobs are queued in Postgres, so the reconciler pushes them (seconds).
        return []


def sequenced_insert(job: NewJob, params: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """A sequenced type's job's insert, numbered in its key (None: not sequenced)."""
    if job.seq_key is None:
        return None
    return SEQ["insert_job_in_sequence"], {
        **params,
        "seq_key": job.seq_key,
        "seq_hold": job.seq_hold,
    }


def number_copied(conn: Conn, jobs: Sequence[NewJob]) -> None:
    """After a COPY of one type's jobs, in its transaction: number them in their keys."""
    keyed = [j for j in jobs if j.seq_key is not None]
    if not keyed:
        return
    conn.execute(SEQ["sequence_copied"], copied_params(keyed))


def copied_params(keyed: Sequence[NewJob]) -> dict[str, Any]:
    return {
        "ids": [j.id for j in keyed],
        "keys": [j.seq_key for j in keyed],
        "name": keyed[0].name,
        "hold": keyed[0].seq_hold,
    }


class Hold(msgspec.Struct, frozen=True, kw_only=True):
    """A held key: the job failed for good that holds it, its error, since when."""

    key: str
    job_id: str
    error: str | None
    held_at: datetime


class SequenceStore:
    """Keys and holds of sequenced types, over the Store's connection pool."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def keys(self, name: str, limit: int = 1000) -> list[KeyState]:
        """The type's keys with live jobs or a hold, held keys first."""
        with self.store.connection() as conn:
            cur = conn.cursor(row_factory=class_row(KeyState))
            return cur.execute(SEQ["keys"], {"name": name, "limit": limit}).fetchall()

    def hand_over_stalled(self, limit: int = 1000) -> list[tuple[str, str, int]]:
        """Unpark the next job of every key left parked with nothing holding it back (see
        stalled_keys), each under its key's lock; returns them as pushes (id, type,
        priority). Their NOTIFY goes out too: a duplicate push is refused by the claim."""
        pushes: list[tuple[str, str, int]] = []
        with self.store.connection() as conn:
            keys = conn.execute(SEQ["stalled_keys"], {"limit": limit}).fetchall()
            for name, key in keys:
                params = {"name": name, "key": key}
                with conn.transaction():
                    conn.execute(SEQ["lock_key"], params)
                    row = conn.execute(SEQ["hand_over"], params).fetchone()
                    job_id = None if row is None else row[0]
                    pushed = conn.execute(SEQ["handed_over"], {"id": job_id}).fetchone()
                if pushed is not None:
                    pushes.append((str(pushed[0]), str(pushed[1]), int(pushed[2])))
        return pushes

    def prune_idle(self, retention_s: float, limit: int = 1000) -> int:
        """Delete the counters of keys with no live job and no hold, last used more than
        `retention_s` ago, at most `limit`; returns how many. Locks first, then looks again
        with a new snapshot (lock_idle, delete_idle): see sequence.sql."""
        params: dict[str, Any] = {"retention_s": retention_s, "limit": limit}
        with self.store.connection() as conn, conn.transaction():
            idle = conn.execute(SEQ["lock_idle"], params).fetchall()
            if not idle:
                return 0
            params |= {"names": [r[0] for r in idle], "keys": [r[1] for r in idle]}
            return len(conn.execute(SEQ["delete_idle"], params).fetchall())

    def holds(self, name: str, limit: int = 20) -> list[Hold]:
        """The type's held keys, oldest first (the dashboard's notice)."""
        with self.store.connection() as conn:
            cur = conn.cursor(row_factory=class_row(Hold))
            return cur.execute(SEQ["holds"], {"name": name, "limit": limit}).fetchall()

    def parked_counts(self) -> dict[str, int]:
        """Queued jobs waiting for their key (parked, out of Redis), per type."""
        with self.store.connection() as conn:
            return dict(conn.execute(SEQ["parked_counts"]).fetchall())

    def held_counts(self) -> dict[str, int]:
        """Held keys per type (the hold table holds only held keys: a small read)."""
        with self.store.connection() as conn:
            return dict(conn.execute(SEQ["held_counts"]).fetchall())

    def release(self, name: str, key: str) -> str | None:
        """End the key's hold (its failed job stays failed) and hand the key to its next
        job; returns the id of the failed job that held it (None: it was not held)."""
        params = {"name": name, "key": key}
        with self.store.connection() as conn, conn.transaction():
            conn.execute(SEQ["lock_key"], params)
            row = conn.execute(SEQ["release_hold"], params).fetchone()
            conn.execute(SEQ["hand_over"], params)
        return None if row is None else str(row[0])

    def hold_of(self, name: str, key: str) -> str | None:
        """The id of the failed job holding the key (None: not held)."""
        with self.store.connection() as conn:
            row = conn.execute(SEQ["hold_of"], {"name": name, "key": key}).fetchone()
        return None if row is None else str(row[0])

    def take_hold_place(self, name: str, key: str, held: str, new_id: str) -> bool:
        """The replay `new_id` of the job `held` that holds the key takes its place: it
        runs next, and the hold ends. False when the hold no longer names that job."""
        params = {"name": name, "key": key, "held": held, "id": new_id}
        with self.store.connection() as conn, conn.transaction():
            conn.execute(SEQ["lock_key"], params)
            taken = conn.execute(SEQ["take_hold_place"], params).fetchone() is not None
            conn.execute(SEQ["hand_over"], params)
        return taken
