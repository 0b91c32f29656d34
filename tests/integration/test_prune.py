"""Archive retention keeps up: days of archive past retention are deleted in one pass at
thousands of rows a second (one 10,000-row batch a minute capped it at 167 jobs/s), and
rows within retention stay."""

from __future__ import annotations

from hivejobs.coordinator.pruner import Pruner
from hivejobs.store import Store
from tests.harness import sql

FILL = """
INSERT INTO hivejobs_archive (id, name, state, priority, attempt, attempts, delivery,
                              payload, created_at, run_at, finished_at)
SELECT 'old-' || g, 'resize', 'succeeded', 1, 1, 3, 'at_least_once', '\\x7b7d',
       now() - %(age)s * interval '1 second', now() - %(age)s * interval '1 second',
       now() - %(age)s * interval '1 second' + g * interval '1 millisecond'
  FROM generate_series(1, %(n)s) AS g
"""


def test_prune_pass_deletes_days_of_archive_fast_and_keeps_recent_rows(
    database_url: str,
) -> None:
    week = 7 * 24 * 3600.0
    # Three days of archive past retention at ~0.5 job/s each, and a day within it.
    sql(database_url, FILL, {"age": week + 3 * 86400, "n": 120_000})
    sql(database_url, FILL.replace("'old-'", "'new-'"), {"age": week - 86400, "n": 1_000})
    store = Store(database_url)
    try:
        result = Pruner(store, retention_s=week).prune(lambda: True)
    finally:
        store.close()
    assert result.deleted == 120_000 and result.caught_up
    rate = result.deleted / result.seconds
    print(f"\narchive prune: {result.deleted} rows in {result.seconds:.1f} s ({rate:,.0f} rows/s)")
    assert rate >= 5_000
    left = sql(
        database_url,
        "SELECT count(*), count(*) FILTER (WHERE id LIKE 'new-%%') FROM hivejobs_archive",
    )[0]
    assert left == (1_000, 1_000)


def test_prune_pass_stops_when_the_lease_is_gone(database_url: str) -> None:
    sql(database_url, FILL, {"age": 30 * 86400.0, "n": 25_000})
    store = Store(database_url)
    try:
        result = Pruner(store, retention_s=86400.0).prune(lambda: False)
    finally:
        store.close()
    assert (result.deleted, result.caught_up) == (10_000, False)  # one batch, then stop
