"""A worker that started on a quiet queue claims and completes a backlog by key.

Its pool prepares each statement at the fifth run, while the hot table holds a job or two,
and keeps that plan: without PREPARED_PLANS (store/session_settings.py) it is a sequential scan of
the table, at every claim and every completion of the backlog that follows.
"""

from __future__ import annotations

from collections.abc import Callable

from hivejobs import App
from tests.harness import Instance, fleet_app, sql, wait_until

BACKLOG = 20_000
QUIET_JOBS = 8  # one at a time: more than the five runs before psycopg prepares


def archived(url: str) -> int:
    return int(sql(url, "SELECT count(*) FROM hivejobs_archive")[0][0])


def hot_table_reads(url: str) -> tuple[int, int]:
    """(sequential scans, rows deleted) of the hot table, as the server's statistics have
    them: each backend reports both together."""
    row = sql(
        url,
        "SELECT seq_scan, n_tup_del FROM pg_stat_user_tables WHERE relname = 'hivejobs_job'",
    )[0]
    return int(row[0]), int(row[1])


def test_a_worker_started_on_a_quiet_queue_never_scans_the_backlog(
    make_app: Callable[..., App],
    start_instance: Callable[..., Instance],
    database_url: str,
) -> None:
    # No ANALYZE comes to plan the statements again: the plans kept are those of the start.
    sql(database_url, "ALTER TABLE hivejobs_job SET (autovacuum_enabled = false)")
    start_instance({"HJ_TYPES": "alo"})
    app = fleet_app(make_app, database_url, ["alo"])
    for n in range(1, QUIET_JOBS + 1):
        app.enqueue("alo", {"ms": 0})
        wait_until(lambda n=n: archived(database_url) == n, what=f"quiet job {n}")
    scans_before, _ = hot_table_reads(database_url)
    app.enqueue_many("alo", [{"ms": 0}] * BACKLOG)
    total = QUIET_JOBS + BACKLOG
    wait_until(lambda: archived(database_url) == total, timeout=120, what="the backlog done")
    # Every pool backend has reported its deletes, and with them its scans.
    wait_until(lambda: hot_table_reads(database_url)[1] >= total, what="statistics reported")
    scans = hot_table_reads(database_url)[0] - scans_before
    # None seen; a kept scan plan is one a claim and one a completion (585 without
    # PREPARED_PLANS, each reading the whole backlog).
    assert scans <= 5, f"{scans} sequential scans of the hot table during the backlog"
