"""Fair dispatch with real `hivejobs run` processes: a small key behind a large key's backlog
finishes long before the backlog does (and does not with the FIFO control type), and a Redis
flush in the middle loses no job.

Order is judged from the handlers' own ledger (tests/apps/fairapp.py), not from our tables.
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from hivejobs import App
from tests.harness import (
    Instance,
    RedisServer,
    fleet_app,
    live_jobs,
    pool_pids,
    read_ledger,
    sql,
    wait_until,
)

APP = "tests.apps.fairapp:app"
BIG, SMALL = 2000, 20


def ends(folder: Path, ids: list[str]) -> list[tuple[int, str]]:
    """(monotonic ns, customer) of every finished run of these jobs, in time order."""
    wanted = set(ids)
    return sorted((int(p[3]), p[2]) for p in read_ledger(folder) if p[1] in wanted)


def big_done_when_small_done(folder: Path, ids: list[str]) -> int:
    """How many of the big key's jobs had finished when the small key's last one did."""
    runs = ends(folder, ids)
    small_last = max(t for t, who in runs if who == "b")
    return sum(1 for t, who in runs if who == "a" and t < small_last)


@pytest.mark.parametrize(("name", "fair"), [("fair", True), ("fifo", False)])
def test_a_small_key_is_not_starved_by_a_big_backlog(
    start_instance: Callable[..., Instance],
    make_app: Callable[..., App],
    database_url: str,
    ledger_dir: Path,
    name: str,
    fair: bool,
) -> None:
    """Key A enqueues 2,000 jobs, then key B 20. Fair: B's last job finishes while most of A's
    backlog still waits (each turn serves one of A and one of B). The FIFO control runs A's
    2,000 first: the same measure shows the difference."""
    start_instance(app_spec=APP)
    app = fleet_app(make_app, database_url, [name])
    big = app.enqueue_many(name, [{"customer": "a"}] * BIG)
    assert app.flush()
    small = app.enqueue_many(name, [{"customer": "b"}] * SMALL)
    wait_until(
        lambda: sum(1 for _, who in ends(ledger_dir, small) if who == "b") == SMALL,
        timeout=90,
        what="the small key's jobs done",
    )
    before = big_done_when_small_done(ledger_dir, big + small)
    if fair:
        assert before < BIG // 4, f"{before} of A's jobs finished before B's last"
    else:
        wait_until(lambda: live_jobs(database_url) == 0, timeout=90, what="all done")
        assert before > BIG * 9 // 10, f"only {before} of A's jobs finished before B's last"


def test_a_redis_flush_loses_no_job_of_a_fair_type(
    start_instance: Callable[..., Instance],
    make_app: Callable[..., App],
    database_url: str,
    ledger_dir: Path,
    own_redis: RedisServer,
) -> None:
    """FLUSHALL with ids in the inbox, in per-key lists and in the ring: the reconciler
    pushes every queued job again and each runs once (0 lost)."""
    start_instance({"HIVEJOBS_REDIS_URL": own_redis.url}, app_spec=APP)
    app = fleet_app(make_app, database_url, ["fair"], redis_url=own_redis.url)
    ids = app.enqueue_many("fair", [{"customer": f"c{i % 50}", "ms": 2} for i in range(1500)])
    assert app.flush()
    client = redis.Redis.from_url(own_redis.url)
    wait_until(lambda: len(ends(ledger_dir, ids)) >= 100, what="some jobs done")
    assert (
        client.zcard(f"{app.connections.broker.prefix}{{fair}}:fring") > 0
    )  # per-key lists in use
    client.flushall()
    wait_until(lambda: client.exists(app.connections.broker.boot_key), timeout=60, what="restore")
    wait_until(lambda: live_jobs(database_url) == 0, timeout=90, what="all jobs finished")
    ran = Counter(p[1] for p in read_ledger(ledger_dir) if p[0] == "end")
    assert [i for i in ids if ran[i] != 1] == []  # each ran once: none lost, none twice
    client.close()


def test_fair_and_limited_on_one_field_runs_everything_one_per_key(
    start_instance: Callable[..., Instance],
    make_app: Callable[..., App],
    database_url: str,
    ledger_dir: Path,
) -> None:
    """limit_by refuses the ids of a key at its cap; they go back through the inbox and are
    sorted to their key's list again: every job runs once, B's few while A's many wait (B's
    ids are sorted too, though the refused ids keep coming back to another inbox list)."""
    start_instance(app_spec=APP)
    app = fleet_app(make_app, database_url, ["fair_limited"])
    big = app.enqueue_many("fair_limited", [{"customer": "a", "ms": 5}] * 200)
    assert app.flush()
    # One by one: through the inbox (at priority 3), which A's refused ids keep refilling at 0.
    small = [app.enqueue("fair_limited", {"customer": "b", "ms": 5}, priority=3) for _ in range(5)]
    wait_until(lambda: live_jobs(database_url) == 0, timeout=90, what="all done")
    ran = Counter(p[1] for p in read_ledger(ledger_dir) if p[0] == "end")
    assert [i for i in big + small if ran[i] != 1] == []
    assert big_done_when_small_done(ledger_dir, big + small) < 100


def test_a_killed_fair_pool_loses_no_job(
    start_instance: Callable[..., Instance],
    make_app: Callable[..., App],
    database_url: str,
    ledger_dir: Path,
) -> None:
    """kill -9 of the fair pool mid-drain: its claims are rescued, and the ids it had popped
    from the ring and not claimed (out of every Redis list) are pushed again by the
    reconciler. Every job succeeds; none is left queued."""
    start_instance(app_spec=APP)
    app = fleet_app(make_app, database_url, ["fair"])
    ids = app.enqueue_many("fair", [{"customer": f"c{i % 30}", "ms": 3} for i in range(1500)])
    wait_until(lambda: len(ends(ledger_dir, ids)) >= 200, what="some jobs done")
    (victim,) = pool_pids(database_url, "fair")
    os.kill(victim, signal.SIGKILL)
    wait_until(lambda: live_jobs(database_url) == 0, timeout=120, what="all jobs finished")
    ran = Counter(p[1] for p in read_ledger(ledger_dir) if p[0] == "end")
    assert [i for i in ids if ran[i] < 1] == []  # a finished but unwritten attempt re-runs
    done = sql(
        database_url,
        "SELECT count(*) FROM hivejobs_archive WHERE state = 'succeeded' AND id = ANY(%s)",
        (ids,),
    )
    assert done == [(len(ids),)]
