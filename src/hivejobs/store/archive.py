"""Job listing over live and archived jobs, and the archive's upkeep (archive.sql):
`list_jobs`, the gauges' stale types, retention per job type and pruning.

Part of store/, so it speaks SQL and decides nothing: callers pass filters and settings.
Kept apart from Store's hot-path statements (enqueue, claim, finish), which it never runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING

from psycopg.rows import dict_row

from hivejobs.records.jobs import JobSummary
from hivejobs.store.dashboard import job_summary
from hivejobs.store.sql import load_queries

if TYPE_CHECKING:
    from hivejobs.store import Store

ARCHIVE = load_queries("archive.sql")
MAINTENANCE = load_queries("maintenance.sql")
FLOW = load_queries("flow.sql")
DEBOUNCE = load_queries("debounce.sql")
PROGRESS = load_queries("progress.sql")
PRUNE_BATCH = 10_000


def list_jobs(
    store: Store,
    *,
    states: list[str] | None,
    name: str | None,
    since: datetime | None,
    since_s: float | None,
    until: datetime | None,
    after: tuple[datetime, str] | None,
    limit: int,
) -> list[JobSummary]:
    """One page, newest first; `after` is the (at, id) of the last job of the page before."""
    after_at, after_id = after or (None, None)
    params = {
        "states": states,
        "name": name,
        "since": since,
        "since_s": since_s,
        "until": until,
        "after_at": after_at,
        "after_id": after_id,
        "limit": limit,
    }
    with store.connection() as conn:
        cur = conn.cursor(row_factory=dict_row)
        return [job_summary(r) for r in cur.execute(ARCHIVE["list_jobs"], params)]


def nonzero_gauge_types(store: Store) -> set[str]:
    with store.connection() as conn:
        return {r[0] for r in conn.execute(ARCHIVE["nonzero_gauge_types"]).fetchall()}


def set_type_retentions(store: Store, retentions: Mapping[str, float | None]) -> None:
    """Declared by the supervisor after the job types (None: the global retention)."""
    if not retentions:
        return
    params = {"names": list(retentions), "retentions": list(retentions.values())}
    with store.connection() as conn:
        conn.execute(ARCHIVE["set_type_retentions"], params)


def prune_archive(store: Store, retention_s: float) -> int:
    """One batch of archived jobs past their type's retention (or `retention_s`), then the
    unique windows that have passed, the limit_by token buckets that have refilled to full
    (no row means a full bucket; flow.py), the debounce keys whose job has started and the
    progress rows of jobs gone (progress.py): the coordinator's prune, in place of
    Store.prune_archive (whose single retention would delete a longer-lived type's jobs)."""
    with store.connection() as conn:
        cur = conn.execute(
            ARCHIVE["prune_archive_by_type"], {"retention_s": retention_s, "limit": PRUNE_BATCH}
        )
        conn.execute(MAINTENANCE["prune_unique"])
        conn.execute(FLOW["prune_full_buckets"])
        conn.execute(DEBOUNCE["prune_debounce"])  # keys whose job started: store/debounce.py
        conn.execute(PROGRESS["prune_progress"], {"retention_s": retention_s})
        return cur.rowcount
