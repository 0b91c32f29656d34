"""A pool killed mid-drain, then its suspects re-run alone, with a real `hivejobs run`.

Every job a killed pool held is charged a loss and runs alone on its next attempt (the
quarantine: a poison pill cannot take neighbours down twice). The suspect waits until its
pool holds no other claim; the claims that pool fetched ahead are waiting for a runner, and
in a pool of one runner the only runner is the suspect's own. These tests kill a pool that
holds claims ahead, for one runner, two, and a one-runner type in a shared pool, and expect
every job to end.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

import pytest

from hivejobs import App
from tests.harness import Instance, fleet_app, live_jobs, pool_pids, sql, wait_until

pytestmark = pytest.mark.faults

JOBS = 300


def claims_held(url: str, pid: int) -> int:
    """Jobs `running` in Postgres under the pool process `pid` (started or fetched ahead)."""
    rows = sql(
        url,
        "SELECT count(*) FROM hivejobs_job j JOIN hivejobs_worker w ON w.id = j.worker_id"
        " WHERE j.state = 'running' AND w.pid = %s",
        (pid,),
    )
    return int(rows[0][0])


def kill_mid_drain_and_drain(
    make_app: Callable[..., App],
    start_instance: Callable[..., Instance],
    database_url: str,
    *,
    job_type: str,
    pool: str,
    concurrency: int,
    extra_env: dict[str, str],
    app_spec: str,
) -> None:
    start_instance(extra_env, app_spec=app_spec)
    app = fleet_app(make_app, database_url, [pool])
    app.enqueue_many(job_type, [{"ms": 20}] * JOBS)
    victim = wait_until(lambda: pool_pids(database_url, pool), what="pool")[0]
    # A pool in its stride, fetching ahead of its runners: every claim it holds is charged
    # the loss, and the new pool claims those suspects together with queued neighbours.
    wait_until(
        lambda: claims_held(database_url, victim) > concurrency,
        what="claims fetched ahead of the runners",
    )
    os.kill(victim, signal.SIGKILL)
    wait_until(
        lambda: [p for p in pool_pids(database_url, pool) if p != victim],
        what="replacement pool",
    )
    # Without the fix the new pool stops for good with a suspect waiting on a claim that
    # only its own (one) runner could hand back: nothing would move after that.
    wait_until(lambda: live_jobs(database_url) == 0, timeout=120, what="every job ended")
    rows = sql(
        database_url,
        "SELECT state, attempt > 1, count(*) FROM hivejobs_archive GROUP BY 1, 2 ORDER BY 1, 2",
    )
    by_outcome = {(r[0], r[1]): int(r[2]) for r in rows}
    assert sum(n for (state, _), n in by_outcome.items() if state == "succeeded") == JOBS
    # The killed pool's claims were re-run as suspects (how many it held at the kill is the
    # pool's timing: at least the one that was running).
    assert by_outcome.get(("succeeded", True), 0) >= 1


# A `def` type's jobs run on runner threads; an `async def` type's are tasks on the pool's
# loop, and its suspect waits for its turn in a thread of its own.
KINDS = {
    "def": ("alo", "tests.apps.faultapp:app"),
    "async": ("alo_async", "tests.apps.asyncapp:app"),
}


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("concurrency", [1, 2])
def test_killed_pool_drains_after_its_suspects(
    kind: str,
    concurrency: int,
    make_app: Callable[..., App],
    start_instance: Callable[..., Instance],
    database_url: str,
) -> None:
    job_type, app_spec = KINDS[kind]
    kill_mid_drain_and_drain(
        make_app,
        start_instance,
        database_url,
        job_type=job_type,
        pool=job_type,
        concurrency=concurrency,
        extra_env={"HJ_TYPES": job_type, f"HJ_CONCURRENCY_{job_type.upper()}": str(concurrency)},
        app_spec=app_spec,
    )


def test_killed_shared_pool_drains_its_one_runner_type(
    make_app: Callable[..., App],
    start_instance: Callable[..., Instance],
    database_url: str,
) -> None:
    """`one` has one runner in pool "small" (its lane's slots are its own)."""
    kill_mid_drain_and_drain(
        make_app,
        start_instance,
        database_url,
        job_type="one",
        pool="one",  # a worker row per type of the shared pool "small"
        concurrency=1,
        extra_env={},
        app_spec="tests.apps.poolapp:app",
    )
