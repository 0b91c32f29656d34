"""The `prune` bench scenario: days of archive past retention, deleted by one Pruner pass.

Retention keeps up when the rows a pass deletes per second exceed the sustained job rate
(a pass runs until caught up, every 10 s); one 10,000-row batch a minute kept up with
167 jobs/s only.
"""

from __future__ import annotations

from hivejobs.bench.environment import BenchEnvironment
from hivejobs.coordinator.pruner import Pruner
from hivejobs.store import Store, connect

RETENTION_S = 7 * 24 * 3600.0
# One day of archive per statement: finished_at spread over the day, all past retention.
FILL_DAY = """
INSERT INTO hivejobs_archive (id, name, state, priority, attempt, attempts, delivery,
                              payload, created_at, run_at, finished_at)
SELECT 'prune-' || %(day)s || '-' || g, 'bench_noop', 'succeeded', 1, 1, 1, 'at_least_once',
       '\\x7b7d', t, t, t
  FROM generate_series(1, %(n)s) AS g,
       LATERAL (SELECT now() - %(age)s * interval '1 second'
                       - g * (86400.0 / %(n)s) * interval '1 second' AS t) AS at
"""


def prune_scenario(env: BenchEnvironment, rows: int, days: int = 3) -> dict[str, float]:
    """Fill `days` days with `rows` archive rows in all, then time one pruning pass."""
    per_day = max(rows // days, 1)
    with connect(env.database_url) as conn:
        for day in range(days):
            conn.execute(FILL_DAY, {"day": day, "n": per_day, "age": RETENTION_S + day * 86400.0})
        conn.execute("ANALYZE hivejobs_archive")
    store = Store(env.database_url, max_size=1)
    try:
        result = Pruner(store, RETENTION_S, max_run_s=600.0).prune(lambda: True)
    finally:
        store.close()
    return {
        "prune_rows": float(result.deleted),
        "prune_days": float(days),
        "prune_s": result.seconds,
        "prune_rows_per_s": result.deleted / max(result.seconds, 1e-6),
    }
