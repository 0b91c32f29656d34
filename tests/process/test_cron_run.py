"""Periodic jobs with two real `hivejobs run` instances: exactly one enqueue per tick, through
a kill -9 of the leading coordinator (catch_up, so the ticks of the failover are owed too)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from tests.harness import ROOT, Instance, ledger_starts, sql, wait_until

LEADER_PID = """SELECT w.pid FROM hivejobs_worker w JOIN hivejobs_leader l ON l.holder = w.id
                 WHERE l.expires_at > now()"""
TICKS = (
    "SELECT id FROM hivejobs_job WHERE id LIKE 'cron:%' UNION ALL "
    "SELECT id FROM hivejobs_archive WHERE id LIKE 'cron:%'"
)


def tick_times(url: str) -> list[datetime]:
    ids = [r[0] for r in sql(url, TICKS)]
    return sorted(datetime.strptime(i.split(":", 2)[2], "%Y-%m-%dT%H:%M:%SZ") for i in ids)


def leader_pid(url: str) -> int | None:
    rows = sql(url, LEADER_PID)
    return int(rows[0][0]) if rows else None


def test_one_job_per_tick_through_a_coordinator_kill(
    start_instance: Callable[..., Instance],
    database_url: str,
    ledger_dir: Path,
    instance_env: dict[str, str],
) -> None:
    env = {"HJ_TYPES": "alo", "HJ_CRON": "* * * * * *"}  # every second
    first = start_instance(env)
    wait_until(lambda: len(tick_times(database_url)) >= 2, timeout=20, what="first ticks")
    second = start_instance(env)
    wait_until(
        lambda: (
            sql(database_url, "SELECT count(*) FROM hivejobs_worker WHERE role = 'coordinator'")[0][
                0
            ]
            == 2
        ),
        what="two coordinators",
    )
    victim = leader_pid(database_url)
    assert victim is not None
    before = len(tick_times(database_url))
    os.kill(victim, signal.SIGKILL)
    # A new leader (the other instance, or the restarted coordinator) takes the lease once it
    # expires, and catches up the ticks nobody enqueued meanwhile.
    wait_until(
        lambda: (leader_pid(database_url) or victim) != victim,
        timeout=20,
        what="a new leader",
    )
    wait_until(
        lambda: len(tick_times(database_url)) >= before + 8,
        timeout=20,
        what="ticks after the failover",
    )
    listed = subprocess.run(
        [sys.executable, "-m", "hivejobs", "cron"],
        env=instance_env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    for inst in (first, second):
        inst.signal_group(signal.SIGTERM)
    assert first.wait(20) == 0 and second.wait(20) == 0

    times = tick_times(database_url)
    seconds = [int((t - times[0]).total_seconds()) for t in times]
    assert seconds == list(range(len(times)))  # every tick once: no gap, no duplicate
    starts = ledger_starts(ledger_dir)
    assert max(starts.values()) == 1  # no tick's job started twice
    assert "tick" in listed and "* * * * * *" in listed
