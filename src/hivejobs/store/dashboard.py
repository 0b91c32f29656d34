"""The dashboard's and the API's list reads: keyset pages and live counts.

SQL in dashboard_queries.sql. Pages never use OFFSET and never count the archive: a page is one
index range read whatever the archive holds (bench: `python -m hivejobs.bench.dashboard`).
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

import msgspec
from psycopg.rows import class_row, dict_row

from hivejobs.display import exception_line
from hivejobs.records.chains import ChainSummary
from hivejobs.records.jobs import JobSummary
from hivejobs.store.sql import load_queries

if TYPE_CHECKING:
    from hivejobs.store import Store

QUERIES = load_queries("dashboard_queries.sql")
ListName = Literal["queued", "scheduled", "running", "failed", "finished"]
LIST_QUERY: dict[str, str] = {
    "queued": "queued_jobs",
    "scheduled": "scheduled_jobs",
    "running": "running_jobs",
    "failed": "failed_jobs",
    "finished": "finished_jobs",
}
NEWEST_FIRST = frozenset({"failed", "finished"})
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
FAR_FUTURE = datetime(9999, 1, 1, tzinfo=UTC)


class ChainRow(ChainSummary, frozen=True, kw_only=True):
    """A chain as the dashboard lists it, with its job counts."""

    sort_at: datetime


class LeaderRow(msgspec.Struct, frozen=True, kw_only=True):
    """The lease row as the dashboard shows it."""

    holder: str | None
    term: int
    acquired_at: datetime
    expires_at: datetime
    valid: bool
    expires_in_s: float


class LogRow(msgspec.Struct, frozen=True, kw_only=True):
    """One try of the chain page's job log; `total`: the whole log's length."""

    key: str
    try_: int
    state: str
    finished_at: datetime
    error: str | None
    total: int


def job_summary(row: dict[str, Any]) -> JobSummary:
    """A row (dict_row) of a query that selects JobSummary's fields but `error_line`, which
    comes from `error_tail` (the end of a long error, where the exception line is) or,
    without that column, from the whole `error`."""
    tail = row.pop("error_tail") if "error_tail" in row else row["error"]
    return JobSummary(**row, error_line=exception_line(tail) if row["error"] else None)


# The tail of a try's error the chain page shows (the job's page has all of it).
ERROR_CHARS = 500
Cursor = tuple[datetime, str]


def encode_cursor(at: datetime | None, job_id: str) -> str:
    """An opaque `after` token: the sort key of the last row of a page."""
    return f"{(at or EPOCH).isoformat()}|{job_id}"


def decode_cursor(token: str | None, newest_first: bool) -> Cursor:
    """The start of a page; a token that does not parse starts from the beginning."""
    if token:
        at, sep, job_id = token.partition("|")
        try:
            moment = datetime.fromisoformat(at)
        except ValueError:
            moment = None
        if sep and moment is not None and moment.tzinfo is not None:
            return moment, job_id
    return (FAR_FUTURE, "") if newest_first else (EPOCH, "")


class DashboardStore:
    """Reads over a Store's connection pool (owns nothing else)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def live_counts(self) -> dict[str, dict[str, int]]:
        """{type: {state: n}} for live jobs (the hot table only)."""
        counts: dict[str, dict[str, int]] = defaultdict(dict)
        with self.store.connection() as conn:
            for name, state, n in conn.execute(QUERIES["live_counts"]).fetchall():
                counts[name][state] = int(n)
        return dict(counts)

    def jobs(
        self, which: ListName, name: str | None, after: str | None, limit: int
    ) -> tuple[list[JobSummary], str | None]:
        """One page and the token of the next one (None: this was the last page)."""
        at, job_id = decode_cursor(after, which in NEWEST_FIRST)
        params = {"name": name, "after_at": at, "after_id": job_id, "limit": limit + 1}
        with self.store.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            rows = [job_summary(r) for r in cur.execute(QUERIES[LIST_QUERY[which]], params)]
        more = len(rows) > limit
        rows = rows[:limit]
        nxt = encode_cursor(rows[-1].at, rows[-1].id) if more and rows else None
        return rows, nxt

    def chains(self, after: str | None, limit: int) -> tuple[list[ChainRow], str | None]:
        at, chain_id = decode_cursor(after, True)
        params = {"after_at": at, "after_id": chain_id, "limit": limit + 1}
        with self.store.connection() as conn:
            cur = conn.cursor(row_factory=class_row(ChainRow))
            rows = cur.execute(QUERIES["chains_page"], params).fetchall()
        more = len(rows) > limit
        rows = rows[:limit]
        nxt = encode_cursor(rows[-1].sort_at, rows[-1].id) if more and rows else None
        return rows, nxt

    def chain_log(self, chain_id: str, offset: int, limit: int) -> tuple[list[LogRow], int]:
        """A page of a chain's job log (long errors cut to their tail) and its total length."""
        params = {"id": chain_id, "offset": offset, "limit": limit, "error_chars": ERROR_CHARS}
        with self.store.connection() as conn:
            cur = conn.cursor(row_factory=class_row(LogRow))
            rows = cur.execute(QUERIES["chain_log_page"], params).fetchall()
        return rows, rows[0].total if rows else 0

    def leader(self) -> LeaderRow | None:
        with self.store.connection() as conn:
            cur = conn.cursor(row_factory=class_row(LeaderRow))
            return cur.execute(QUERIES["leader"]).fetchone()
