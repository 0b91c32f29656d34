"""A real `hivejobs run`: several types, a kill -9 of one pool process, SIGTERM exits 0."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

from hivejobs import App
from tests.apps.gate import open_gate
from tests.harness import (
    Instance,
    alive,
    fleet_app,
    ledger_oks,
    ledger_starts,
    pool_pids,
    running_in_pid,
    sql,
    wait_until,
)


def archived(url: str, state: str = "succeeded") -> int:
    return int(sql(url, "SELECT count(*) FROM hivejobs_archive WHERE state = %s", (state,))[0][0])


def test_run_processes_types_survives_pool_kill_and_exits_zero_on_sigterm(
    make_app: Callable[..., App],
    start_instance: Callable[..., Instance],
    database_url: str,
    ledger_dir: Path,
) -> None:
    inst = start_instance({"HJ_TYPES": "alo,amo"})
    app = fleet_app(make_app, database_url, ["alo", "amo"])
    alo_ids = app.enqueue_many("alo", [{"ms": 50}] * 400)
    amo_ids = app.enqueue_many("amo", [{"ms": 5}] * 100)

    victim = pool_pids(database_url, "alo")[0]
    wait_until(lambda: len(running_in_pid(ledger_dir, victim)) >= 4, what="alo jobs mid-run")
    os.kill(victim, signal.SIGKILL)
    # The supervisor restarts the pool with a fresh identity.
    wait_until(
        lambda: [p for p in pool_pids(database_url, "alo") if p != victim], what="replacement pool"
    )
    wait_until(lambda: archived(database_url) == 500, timeout=60, what="all jobs succeeded")

    # Every job succeeded; outside the killed process at most once (an attempt that ended in
    # it just before the kill, its completion not yet committed, is re-run by design: I4),
    # and an at-most-once job never started twice.
    everywhere = ledger_oks(ledger_dir)
    outside = ledger_oks(ledger_dir, killed={victim})
    assert [i for i in alo_ids + amo_ids if everywhere[i] < 1] == []
    assert [i for i in alo_ids + amo_ids if outside[i] > 1] == []
    starts = ledger_starts(ledger_dir)
    assert [i for i in amo_ids if starts[i] != 1] == []
    rows = sql(database_url, "SELECT count(*) FROM hivejobs_archive WHERE attempt > 1")
    assert rows[0][0] >= 1  # the jobs that were mid-run in the killed process ran again

    # SIGTERM while a job runs: it finishes, then everything exits 0. The job holds at a
    # gate until the supervisor says it waits for it, so it is surely running at the SIGTERM.
    slow = app.enqueue("alo", {"gate": "slow"})
    wait_until(
        lambda: any(p[0] == "start" and p[1] == slow for p in _ledger(ledger_dir)),
        what="slow job started",
    )
    pids = pool_pids(database_url, "alo") + pool_pids(database_url, "amo")
    inst.signal_group(signal.SIGTERM)
    wait_until(
        lambda: "waiting up to" in inst.log_text() and slow[:8] in inst.log_text(),
        what="the supervisor waiting for the slow job",
    )
    open_gate(app.connections.broker, "slow")
    assert inst.wait(15) == 0
    assert app.get_job(slow).state == "succeeded"
    assert not [p for p in pids if alive(p)]
    assert sql(database_url, "SELECT count(*) FROM hivejobs_worker")[0][0] == 0


def _ledger(folder: Path) -> list[list[str]]:
    from tests.harness import read_ledger

    return read_ledger(folder)
