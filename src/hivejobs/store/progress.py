"""The last progress of each job (progress.sql, migration 0020): what a late reader of a
job's stream sees first, and what is left of a finished job's progress.

Part of store/: decides nothing (the pool decides when a row is due: worker/streaming.py).
Statements are plans, so the sync Store and the AsyncStore run the same ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from hivejobs.records.events import JobEvent

if TYPE_CHECKING:
    from hivejobs.store import Store
from hivejobs.store.sql import Steps, load_queries, run_plan

PROGRESS = load_queries("progress.sql")


def progress_plan(job_id: str) -> Steps[JobEvent | None]:
    row = yield PROGRESS["get_progress"], {"id": job_id}
    if row is None:
        return None
    _, attempt, done, total, note, _ = row
    return JobEvent(
        kind="progress", job_id=job_id, attempt=attempt, done=done, total=total, note=note
    )


def get_progress(store: Store, job_id: str) -> JobEvent | None:
    with store.connection() as conn:
        return run_plan(conn, progress_plan(job_id))


def save_progress(store: Store, events: Sequence[JobEvent]) -> None:
    """One upsert for every job's latest progress (an older attempt never overwrites)."""
    if not events:
        return
    params = {
        "job_ids": [e.job_id for e in events],
        "attempts": [e.attempt for e in events],
        "dones": [e.done or 0.0 for e in events],
        "totals": [e.total for e in events],
        "notes": [e.note for e in events],
    }
    with store.connection() as conn:
        conn.execute(PROGRESS["save_progress"], params)


def prune_progress(store: Store, retention_s: float) -> int:
    with store.connection() as conn:
        return conn.execute(PROGRESS["prune_progress"], {"retention_s": retention_s}).rowcount
