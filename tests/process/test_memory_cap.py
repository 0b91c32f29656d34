"""`max_rss_mb` with a real `hivejobs run`: a pool past its cap drains and is
forked again; no job fails or is lost, with `def` and `async def` handlers alike."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from hivejobs import App
from tests.harness import (
    HANDLER_KINDS,
    Instance,
    fleet_app,
    handler_env,
    read_ledger,
    sql,
    wait_until,
)

DONE = "SELECT count(*) FROM hivejobs_archive WHERE name = 'hog' AND state = 'succeeded'"


@pytest.mark.parametrize("kind", HANDLER_KINDS)
def test_a_pool_over_its_memory_cap_is_recycled_without_losing_jobs(
    start_instance: Callable[..., Instance],
    make_app: Callable[..., App],
    database_url: str,
    ledger_dir: Path,
    kind: str,
) -> None:
    env = {"HJ_MAX_RSS": "250", **handler_env(kind)}
    inst = start_instance(env, app_spec="tests.apps.flowapp:app")
    app = fleet_app(make_app, database_url, ["hog"])
    app.enqueue_many("hog", [{"mb": 40}] * 12)  # 480 MiB leaked in all, 40 per job
    wait_until(lambda: sql(database_url, DONE)[0][0] == 12, timeout=90, what="12 jobs done")
    begins = [p for p in read_ledger(ledger_dir) if p[0] == "begin"]
    assert {p[4] for p in begins} == {kind}
    pids = {p[2] for p in begins}
    assert len(pids) >= 2  # recycled at least once (12 x 40 MiB cannot fit under 250)
    attempts = sql(database_url, "SELECT DISTINCT attempt FROM hivejobs_archive")
    assert attempts == [(1,)]  # nothing failed, nothing was charged a second attempt
    assert "memory cap passed: recycling the pool" in inst.log_text()
