"""Sequences per key with real `hivejobs run` instances, kill -9, SIGTERM and a Redis flush.

Order and one-at-a-time are judged from both the archive and the handlers' own ledger
(bench/sequence_check.py; tests/apps/sequenceapp.py writes the ledger), never from one
record alone.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Callable
from pathlib import Path

import redis
from bench.sequence_check import check

from hivejobs import App
from tests.harness import Instance, RedisServer, fleet_app, live_jobs, pool_pids, sql, wait_until

APP = "tests.apps.sequenceapp:app"
DONE = "SELECT count(*) FROM hivejobs_archive WHERE name = %s"


def enqueue_lines(app: App, name: str, keys: int, per_key: int, seed: int) -> dict[str, list[str]]:
    """`per_key` jobs for each of `keys` accounts, interleaved, with random short durations."""
    rng = random.Random(seed)
    lines: dict[str, list[str]] = {f"k{k}": [] for k in range(keys)}
    for i in range(per_key):
        for account, ids in lines.items():
            payload = {"account": account, "i": i, "ms": rng.randint(1, 30)}
            ids.append(app.enqueue(name, payload))
    return lines


def kill_pool(url: str, name: str, dead: dict[int, int]) -> None:
    """kill -9 the type's pool process while it runs a job, and note when it was gone."""
    (victim,) = wait_until(lambda: pool_pids(url, name), what="the pool")
    wait_until(
        lambda: sql(url, "SELECT count(*) FROM hivejobs_job WHERE state = 'running'")[0][0] > 0,
        what="a job running",
    )
    os.kill(victim, signal.SIGKILL)
    dead[victim] = time.monotonic_ns()  # no handler line of the victim can come later
    wait_until(lambda: victim not in pool_pids(url, name), what="the pool gone")
    wait_until(lambda: pool_pids(url, name), what="the pool forked again")


def kills_and_a_rolling_restart(
    first: Instance, start_instance: Callable[..., Instance], database_url: str
) -> tuple[Instance, dict[int, int]]:
    """Two kill -9 of the `ordered` pool, then a second instance starts and the first gets
    SIGTERM. Returns the second instance and each ended pool's pid -> its death time (ns)."""
    dead: dict[int, int] = {}
    for _ in range(2):
        kill_pool(database_url, "ordered", dead)
    second = start_instance(app_spec=APP)
    wait_until(lambda: len(pool_pids(database_url, "ordered")) == 2, what="both pools")
    leaving = [p for p in pool_pids(database_url, "ordered") if os.getpgid(p) == first.pid]
    first.signal_group(signal.SIGTERM)
    assert first.wait(30) == 0
    for pid in leaving:
        dead[pid] = time.monotonic_ns()
    return second, dead


def test_sequences_keep_order_through_kills_and_a_rolling_restart(
    start_instance: Callable[..., Instance],
    make_app: Callable[..., App],
    database_url: str,
    ledger_dir: Path,
) -> None:
    """5 keys x 40 jobs: two kill -9 of the pool and a rolling restart (a second instance
    starts, the first gets SIGTERM): every job succeeds, and per key the runs never overlap
    and start in enqueue order."""
    first = start_instance(app_spec=APP)
    app = fleet_app(make_app, database_url, ["ordered"])
    lines = enqueue_lines(app, "ordered", keys=5, per_key=40, seed=34)
    second, dead = kills_and_a_rolling_restart(first, start_instance, database_url)
    wait_until(lambda: live_jobs(database_url) == 0, timeout=90, what="every job done")
    report = check(database_url, ledger_dir, lines, dead)
    assert report.ok, report
    assert report.runs >= 200
    second.signal_group(signal.SIGTERM)


def test_a_retry_holds_the_key_and_hold_waits_for_a_release(
    start_instance: Callable[..., Instance],
    make_app: Callable[..., App],
    database_url: str,
    ledger_dir: Path,
) -> None:
    """`ordered`: a failed first attempt is retried before the key's next job runs.
    `held`: a job failed for good stops its key (the other key goes on) until released.
    `continued`: a job failed for good lets its key go on."""
    start_instance(app_spec=APP)
    app = fleet_app(make_app, database_url, ["ordered", "held", "continued"])
    retried = [app.enqueue("ordered", {"account": "r", "i": 0, "fail_first": True})]
    retried += [app.enqueue("ordered", {"account": "r", "i": i}) for i in (1, 2)]
    held = [app.enqueue("held", {"account": "a", "i": 0, "fail": True})]
    held += [app.enqueue("held", {"account": "a", "i": i}) for i in (1, 2)]
    other = app.enqueue("held", {"account": "b", "i": 0})
    cont = [app.enqueue("continued", {"account": "c", "i": 0, "fail": True})]
    cont += [app.enqueue("continued", {"account": "c", "i": 1})]

    wait_until(lambda: sql(database_url, DONE, ("ordered",))[0][0] == 3, what="ordered done")
    wait_until(lambda: sql(database_url, DONE, ("continued",))[0][0] == 2, what="continued")
    wait_until(lambda: app.get_job(other).state == "succeeded", what="the other key")
    (key,) = wait_until(lambda: [k for k in app.keys("held") if k.held_by], what="the hold")
    assert (key.key, key.held_by, key.next_id, key.queued) == ('"a"', held[0], held[1], 2)
    assert [app.get_job(i).state for i in held[1:]] == ["queued", "queued"]
    assert [app.get_job(i).state for i in cont] == ["failed", "succeeded"]

    assert app.release_key("held", '"a"') == held[0]
    wait_until(lambda: live_jobs(database_url) == 0, what="the held key's jobs done")
    report = check(database_url, ledger_dir, {"r": retried, "a": held[1:]}, {})
    assert report.ok, report
    assert report.runs == 4 + 3 + 1 + 2  # "r" ran its first job twice, each other job once


def test_sequences_survive_a_redis_flush(
    start_instance: Callable[..., Instance],
    make_app: Callable[..., App],
    database_url: str,
    ledger_dir: Path,
    own_redis: RedisServer,
) -> None:
    """FLUSHALL while keys wait (parked jobs are out of Redis anyway, the key's current job
    is in it): the reconciler restores what was dispatched, the hand-overs go on."""
    start_instance({"HIVEJOBS_REDIS_URL": own_redis.url}, app_spec=APP)
    app = fleet_app(make_app, database_url, ["ordered"], redis_url=own_redis.url)
    lines = enqueue_lines(app, "ordered", keys=4, per_key=25, seed=7)
    wait_until(lambda: sql(database_url, DONE, ("ordered",))[0][0] >= 20, what="some done")
    client = redis.Redis.from_url(own_redis.url)
    client.flushall()
    wait_until(lambda: client.exists(app.connections.broker.boot_key), timeout=60, what="restore")
    wait_until(lambda: live_jobs(database_url) == 0, timeout=90, what="every job done")
    client.close()
    report = check(database_url, ledger_dir, lines, {})
    assert report.ok, report


def test_a_dead_instance_is_rescued_without_reordering(
    start_instance: Callable[..., Instance],
    make_app: Callable[..., App],
    database_url: str,
    ledger_dir: Path,
) -> None:
    """The whole of one instance killed (supervisor, pools, coordinator: no fast path) while
    it runs a key's first job: that claim waits for the other instance's rescue (heartbeat
    older than stuck_after), which puts it back as its key's current job; nothing of the key
    runs meanwhile, and the other key goes on."""
    doomed = start_instance(app_spec=APP)
    app = fleet_app(make_app, database_url, ["ordered"])
    lines = {"a": [app.enqueue("ordered", {"account": "a", "i": 0, "ms_first": 60_000})]}
    lines["a"] += [app.enqueue("ordered", {"account": "a", "i": i}) for i in range(1, 6)]
    (victim,) = pool_pids(database_url, "ordered", host_pid=doomed.pid)
    busy = "SELECT count(*) FROM hivejobs_job j JOIN hivejobs_worker w ON w.id = j.worker_id"
    busy += " WHERE j.id = %s AND j.state = 'running' AND w.pid = %s"
    wait_until(lambda: sql(database_url, busy, (lines["a"][0], victim))[0][0], what="a's first")
    start_instance(app_spec=APP)
    wait_until(lambda: len(pool_pids(database_url, "ordered")) == 2, what="the second pool")
    lines["b"] = [app.enqueue("ordered", {"account": "b", "i": i}) for i in range(6)]
    doomed.signal_group(signal.SIGKILL)
    doomed.wait(10)
    dead = {victim: time.monotonic_ns()}
    wait_until(lambda: live_jobs(database_url) == 0, timeout=90, what="every job done")
    report = check(database_url, ledger_dir, lines, dead)
    assert report.ok, report
    rescued = "SELECT attempt, error FROM hivejobs_archive WHERE id = %s"
    assert sql(database_url, rescued, (lines["a"][0],)) == [(2, "worker lost")]


def test_fair_and_sequenced_at_once(
    start_instance: Callable[..., Instance],
    make_app: Callable[..., App],
    database_url: str,
    ledger_dir: Path,
) -> None:
    """fair_by and sequence_by on one type: the keys' current jobs go through the fair ring
    (the hand-over's dispatch lands in the inbox like any push), order and one-at-a-time per
    account hold, one tenant's backlog does not stop the other's."""
    start_instance({"HJ_SEQ_FAIR": "1"}, app_spec=APP)
    app = fleet_app(make_app, database_url, ["fair_ordered"])
    lines: dict[str, list[str]] = {"a1": [], "a2": [], "b1": []}
    for i in range(15):
        for account in ("a1", "a2", "b1"):
            tenant = account[0]
            payload = {"tenant": tenant, "account": account, "i": i, "ms": 5}
            lines[account].append(app.enqueue("fair_ordered", payload))
    wait_until(lambda: live_jobs(database_url) == 0, timeout=90, what="every job done")
    report = check(database_url, ledger_dir, lines, {})
    assert report.ok, report
    assert report.runs == 45
