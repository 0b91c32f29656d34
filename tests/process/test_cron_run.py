"""Periodic jobs with two real `hivejobs run` instances: exactly one enqueue per tick, through
a kill -9 of the leading coordinator (catch_up, so the ticks of the failover are owed too);
without catch_up, every tick that fell due while a leader held the lease ran once, judged from
the jobs that ran."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime, timedelta
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


RAN = "SELECT id FROM hivejobs_archive WHERE id LIKE 'cron:%%' AND state = 'succeeded'"
LIVE = "SELECT id FROM hivejobs_job WHERE id LIKE 'cron:%%'"
LEASE = "SELECT term, acquired_at FROM hivejobs_leader WHERE expires_at > now()"


def ticks_of(url: str, query: str) -> list[datetime]:
    ids = [r[0] for r in sql(url, query)]
    return sorted(datetime.strptime(i.split(":", 2)[2], "%Y-%m-%dT%H:%M:%S%z") for i in ids)


def ran_ticks(url: str) -> list[datetime]:
    """The ticks whose job ran to success, from the archive (not from any counter)."""
    return ticks_of(url, RAN)


def live_ticks(url: str) -> list[datetime]:
    """The ticks whose job is written but not ended (scheduled ahead, queued or running)."""
    return ticks_of(url, LIVE)


def seconds_between(after: datetime, until: datetime) -> set[datetime]:
    """The whole seconds in (after, until]: the ticks of an every-second schedule."""
    first = after.replace(microsecond=0) + timedelta(seconds=1)
    return {first + timedelta(seconds=k) for k in range(int((until - first).total_seconds()) + 1)}


def db_now(url: str) -> datetime:
    now: datetime = sql(url, "SELECT now()")[0][0]
    return now


def test_without_catch_up_no_tick_is_skipped_while_a_leader_holds_the_lease(
    start_instance: Callable[..., Instance], database_url: str, ledger_dir: Path
) -> None:
    """Ticks under one leader, whose coordinator is paused 2.5 s once (its next pass then finds
    several ticks due, as a late pass on a loaded machine does), a kill -9 of it, ticks under
    the next: every tick in (lease taken, kill] and (next lease taken, end] ran once. The
    ticks of the failover itself (nobody led) are not owed without catch_up."""
    env = {"HJ_TYPES": "alo", "HJ_CRON": "* * * * * *", "HJ_CRON_CATCH_UP": "0"}
    first = start_instance(env)
    second = start_instance(env)
    term, led_from = wait_until(lambda: next(iter(sql(database_url, LEASE)), None), what="leader")
    wait_until(lambda: len(ran_ticks(database_url)) >= 10, timeout=60, interval=0.5, what="ticks")
    paused = leader_pid(database_url)
    assert paused is not None
    os.kill(paused, signal.SIGSTOP)
    time.sleep(2.5)  # the fault's own duration: under the lease's trust window, over 2 ticks
    os.kill(paused, signal.SIGCONT)
    wait_until(lambda: len(ran_ticks(database_url)) >= 30, timeout=60, interval=0.5, what="ticks")
    victim = leader_pid(database_url)
    assert victim is not None
    killed_at = db_now(database_url)  # the leader lives at least until now
    os.kill(victim, signal.SIGKILL)
    new_term, new_from = wait_until(
        lambda: next((r for r in sql(database_url, LEASE) if r[0] > term), None),
        timeout=30,
        what="a new leader",
    )
    wait_until(
        lambda: len([t for t in ran_ticks(database_url) if t > new_from]) >= 15,
        timeout=120,
        interval=0.5,
        what="15 ticks under the new leader",
    )
    ended_at = db_now(database_url)
    owed = seconds_between(led_from, killed_at) | seconds_between(new_from, ended_at)
    wait_until(
        lambda: not [t for t in live_ticks(database_url) if t <= ended_at],
        timeout=60,
        interval=0.5,
        what="the jobs of the ticks so far ended",
    )
    assert sql(database_url, LEASE)[0][0] == new_term  # one failover, not more
    for inst in (first, second):
        inst.signal_group(signal.SIGTERM)
    assert first.wait(20) == 0 and second.wait(20) == 0

    ran = ran_ticks(database_url)
    print(f"\nticks owed {len(owed)}, of them ran {len(owed & set(ran))}; ran in all {len(ran)}")
    assert sorted(owed - set(ran)) == []  # no tick skipped while a leader held the lease
    assert len(ran) == len(set(ran))
    starts = ledger_starts(ledger_dir)
    assert len(starts) >= len(owed) and max(starts.values()) == 1  # none ran twice
