"""A chain try's own statements (ctx.chain, ctx.chain.add) find its row by key, however many
chain jobs the database holds: a 10,000-job fan-out runs 10,000 of them.

As in test_plan_stability: buffers are counted under EXPLAIN (ANALYZE, BUFFERS), not
milliseconds. A scan of 20,000 chain jobs reads hundreds of buffers, a key lookup a few.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import psycopg

from hivejobs import App
from hivejobs.store import new_worker_id
from hivejobs.store.chains import CHAIN_QUERIES, try_id

JOBS = 20_000
MAX_BUFFERS = 20


def chain_job_buffers(plan: dict[str, Any]) -> int:
    """Buffers read by the scans of hivejobs_chain_job in a plan tree."""
    own = plan.get("Shared Hit Blocks", 0) + plan.get("Shared Read Blocks", 0)
    total = own if plan.get("Relation Name") == "hivejobs_chain_job" else 0
    return total + sum(chain_job_buffers(p) for p in plan.get("Plans", []))


def test_a_try_finds_its_chain_job_by_key(make_app: Callable[..., App], database_url: str) -> None:
    make_app().migrate()
    chain_id = "c" * 32
    key = f"scan.{JOBS // 2}"
    job_id = try_id(chain_id, key, 1)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO hivejobs_chain (id, name, args, jobs, state) "
            "VALUES (%s, 'big', '{}', %s, 'running')",
            (chain_id, JOBS),
        )
        conn.execute(
            "INSERT INTO hivejobs_chain_job (chain_id, key, name, payload, priority, delivery, "
            "after_keys, tries, state, job_id) "
            "SELECT %s, 'scan.' || i, 'leaf', '{}', 0, 'at_least_once', '{scan}', 1, "
            "'running', %s || ':scan.' || i || ':1' FROM generate_series(1, %s) i",
            (chain_id, chain_id, JOBS),
        )
        conn.execute(
            "INSERT INTO hivejobs_job (id, name, state, priority, attempts, delivery, payload, "
            "worker_id, attempt) "
            "VALUES (%s, 'leaf', 'running', 0, 1, 'at_least_once', '{}', %s, 1)",
            (job_id, new_worker_id()),
        )
        conn.execute("ANALYZE hivejobs_chain_job")
        statements = {
            "try_context": {"id": chain_id, "key": key, "job_id": job_id},
            "growing_try": {"id": chain_id, "job_id": job_id},
        }
        for name, params in statements.items():
            explained = conn.execute(
                "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + CHAIN_QUERIES[name], params
            ).fetchone()
            assert explained is not None
            plan = explained[0]
            (top,) = plan if isinstance(plan, list) else json.loads(plan)
            assert top["Plan"]["Actual Rows"] == 1, name
            buffers = chain_job_buffers(top["Plan"])
            assert buffers <= MAX_BUFFERS, (name, buffers)
