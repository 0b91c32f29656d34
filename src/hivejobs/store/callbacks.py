"""Status callbacks in Postgres: the end of a callback type's claim, the other service's
outcome, and the deadline sweep. SQL in callback_queries.sql; imports nothing of ours but
records and errors.

A job awaiting its callback is `running` with worker_id NULL and a callback_deadline: no rescue
touches it (no process holds it), and only the attempt number fences the callback, since the
claim token belonged to a claim that has ended.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import msgspec
import psycopg

from hivejobs.records.dispatch import Lease
from hivejobs.records.jobs import Completion
from hivejobs.store.leases import hold_lease
from hivejobs.store.sql import load_queries

if TYPE_CHECKING:
    from hivejobs.store import Store

Conn = psycopg.Connection[Any]
QUERIES = load_queries("callback_queries.sql")
CallbackStatus = Literal["succeeded", "failed"]


class CallbackResult(msgspec.Struct, frozen=True, kw_only=True):
    """What a callback did: `outcome` is None when it was refused (wrong attempt or state);
    `state`/`attempt` then say what the job is now (state None: no such job)."""

    outcome: Literal["succeeded", "failed", "retry"] | None
    state: str | None
    attempt: int | None


def await_callbacks(conn: Conn, completions: Sequence[Completion]) -> int:
    """Called inside Store.finish's transaction; returns the rows the fence let through."""
    rows = conn.execute(
        QUERIES["await_callback_if_running"],
        {
            "ids": [c.id for c in completions],
            "tokens": [c.claim_token for c in completions],
            "timeouts": [c.callback_timeout_s for c in completions],
        },
    ).fetchall()
    return len(rows)


def cancel_awaiting_callback(conn: Conn, job_id: str) -> bool:
    return conn.execute(QUERIES["cancel_awaiting_callback"], {"id": job_id}).fetchone() is not None


def complete_callback(
    conn: Conn,
    name: str,
    job_id: str,
    attempt: int,
    status: CallbackStatus,
    retry_delay_s: float | None,
    error: str | None,
) -> CallbackResult:
    """Apply one callback in one transaction. `retry_delay_s` None: a failure is final."""
    params = {"id": job_id, "name": name, "attempt": attempt, "error": error}
    with conn.transaction():
        if status == "failed" and retry_delay_s is not None:
            retried = conn.execute(
                QUERIES["callback_retry_if_running"], {**params, "delay_s": retry_delay_s}
            ).fetchone()
            if retried is not None:
                return CallbackResult(outcome="retry", state="scheduled", attempt=attempt)
        archived = conn.execute(
            QUERIES["callback_archive_if_running"], {**params, "state": status}
        ).fetchone()
        if archived is not None:
            return CallbackResult(outcome=status, state=status, attempt=attempt)
        row = conn.execute(QUERIES["callback_job_state"], params).fetchone()
    if row is None:
        return CallbackResult(outcome=None, state=None, attempt=None)
    return CallbackResult(outcome=None, state=str(row[0]), attempt=int(row[1]))


class TimedOut(NamedTuple):
    """The types of the jobs retried, and of those failed, because a callback never came."""

    retried: list[str]
    failed: list[str]


def end_timed_out_callbacks(conn: Conn, limit: int) -> TimedOut:
    """The caller runs this under the coordinator lease (inside its transaction)."""
    retried = conn.execute(QUERIES["callback_timeouts_retry"], {"limit": limit}).fetchall()
    failed = conn.execute(QUERIES["callback_timeouts_fail"], {"limit": limit}).fetchall()
    return TimedOut([r[1] for r in retried], [r[1] for r in failed])


class CallbackStore:
    """The callback statements on a Store's connection pool (owns nothing else)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def complete(
        self,
        name: str,
        job_id: str,
        attempt: int,
        status: CallbackStatus,
        retry_delay_s: float | None,
        error: str | None,
    ) -> CallbackResult:
        with self.store.connection() as conn:
            return complete_callback(conn, name, job_id, attempt, status, retry_delay_s, error)

    def end_timed_out_if_leader(self, lease: Lease, limit: int) -> TimedOut | None:
        """Under the coordinator lease (R7, docs/concepts/reliability.md); None when the
        lease no longer holds."""
        if self.store.nothing_to_write(QUERIES["any_callback_timed_out"]):
            return TimedOut([], [])
        with self.store.connection() as conn, conn.transaction():
            if not hold_lease(conn, lease):
                return None
            return end_timed_out_callbacks(conn, limit)
