"""An instance reports the most Postgres connections it can open, and stays under it."""

from __future__ import annotations

import re
import time
from collections.abc import Callable

from hivejobs import App
from tests.harness import Instance, fleet_app, live_jobs, sql, wait_until


def test_instance_reports_its_connection_bound_and_stays_under_it(
    make_app: Callable[..., App],
    start_instance: Callable[..., Instance],
    database_url: str,
) -> None:
    inst = start_instance({"HJ_TYPES": "alo,amo"})
    app = fleet_app(make_app, database_url, ["alo", "amo"])
    found = wait_until(
        lambda: re.search(r"postgres_connections_max\W+(\d+)", inst.log_text()),
        what="the reported bound",
    )
    bound = int(found.group(1))
    assert bound == 1 + 2 * 7 + 4  # supervisor, two pool processes, the coordinator
    app.enqueue_many("alo", [{"ms": 1}] * 300)
    app.enqueue_many("amo", [{"ms": 1}] * 100)
    peak = 0
    while live_jobs(database_url):
        rows = sql(
            database_url,
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid()",
        )
        # Minus the test's own App (its store, at most 1 here).
        peak = max(peak, int(rows[0][0]) - 1)
        time.sleep(0.05)  # the sampling interval, not a synchronisation
    assert 0 < peak <= bound, (peak, bound)
