"""Fault injection against real `hivejobs run` processes (RELIABILITY.md section 4).

Each test builds its state, injects one fault with real signals or real Redis commands, then
checks the invariants from Postgres and the handlers' ledger. Waits poll with deadlines.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from hivejobs import App
from tests.apps.gate import open_gate
from tests.harness import (
    Instance,
    RedisServer,
    alive,
    fleet_app,
    ledger_oks,
    ledger_starts,
    live_jobs,
    pool_pids,
    read_ledger,
    running_in_pid,
    sql,
    wait_until,
)

pytestmark = pytest.mark.faults


def count(url: str, where: str = "true", params: tuple[object, ...] = ()) -> int:
    return int(sql(url, f"SELECT count(*) FROM hivejobs_archive WHERE {where}", params)[0][0])


def test_kill_pool_mid_job(
    make_app: Callable[..., App],
    start_instance: Callable[..., Instance],
    database_url: str,
    ledger_dir: Path,
) -> None:
    """S1: kill -9 pool processes mid-job; alo re-run with the attempt counted, amo never twice."""
    # The rescuer would release the orphans too, after stuck_after: at 120 s it cannot within
    # the test, so their release below is the supervisor's, however slow the machine.
    start_instance({"HJ_TYPES": "alo,amo", "HIVEJOBS_STUCK_AFTER_S": "120"})
    app = fleet_app(make_app, database_url, ["alo", "amo"])
    rng = random.Random(7)
    alo_ids = app.enqueue_many("alo", [{"ms": rng.randint(20, 80)} for _ in range(2000)])
    amo_ids = app.enqueue_many("amo", [{"ms": 100}] * 500)
    killed_amo: set[str] = set()
    killed: set[int] = set()
    for kind, needed in (("alo", 6), ("alo", 6), ("amo", 3), ("alo", 6)):
        victim = wait_until(lambda k=kind: pool_pids(database_url, k), what="pool")[0]
        wait_until(
            lambda v=victim, n=needed, k=kind: len(running_in_pid(ledger_dir, v)) >= n,
            timeout=30,
            what=f"{kind} jobs mid-run",
        )
        mid_run = running_in_pid(ledger_dir, victim)
        os.kill(victim, signal.SIGKILL)
        killed.add(victim)
        # R8: the supervisor's waitpid fast path releases the orphans.
        wait_until(
            lambda ids=mid_run: (
                not sql(
                    database_url,
                    "SELECT 1 FROM hivejobs_job WHERE id = ANY(%s) AND state = 'running'",
                    (list(ids),),
                )
            ),
            timeout=60,
            what="orphans released",
        )
        if kind == "amo":
            killed_amo |= mid_run
        wait_until(
            lambda v=victim, k=kind: [p for p in pool_pids(database_url, k) if p != v],
            what="replacement pool",
        )
    wait_until(lambda: live_jobs(database_url) == 0, timeout=90, what="all jobs finished")

    # Each job ended ok at least once, and at most once outside the killed processes (a run
    # that ended in a killed process just before its completion was committed runs again).
    oks, starts = ledger_oks(ledger_dir), ledger_starts(ledger_dir)
    survivors = ledger_oks(ledger_dir, killed)
    assert [i for i in alo_ids if oks[i] < 1 or survivors[i] > 1] == []
    assert count(database_url, "name = 'alo' AND state = 'succeeded'") == 2000
    assert [i for i in amo_ids if starts[i] > 1] == []
    lost = {
        r[0]
        for r in sql(
            database_url,
            "SELECT id FROM hivejobs_archive WHERE name = 'amo'"
            " AND state = 'failed' AND error = 'worker lost'",
        )
    }
    assert killed_amo and killed_amo <= lost
    assert count(database_url, "name = 'amo'") == 500
    # Re-run jobs carry the attempt of the killed run.
    assert count(database_url, "name = 'alo' AND attempt = 2") >= 18


def leader_pid(url: str) -> tuple[int, int]:
    rows = sql(
        url,
        "SELECT w.pid, l.term FROM hivejobs_leader l JOIN hivejobs_worker w "
        "ON w.id = l.holder WHERE l.expires_at > now()",
    )
    return (int(rows[0][0]), int(rows[0][1])) if rows else (0, 0)


def test_kill_active_coordinator(
    make_app: Callable[..., App],
    start_instance: Callable[..., Instance],
    database_url: str,
    ledger_dir: Path,
) -> None:
    """S2: kill -9 the leader's coordinator; another takes over once the lease expires."""
    start_instance({"HJ_TYPES": "alo"})
    start_instance({"HJ_TYPES": "alo"})
    wait_until(lambda: len(pool_pids(database_url, "alo")) == 2, what="two instances")
    app = fleet_app(make_app, database_url, ["alo"])
    ids = app.enqueue_many("alo", [{"ms": 10}] * 1700)
    delayed = [app.enqueue("alo", {"ms": 1}, delay=random.uniform(1, 8)) for _ in range(300)]
    terms = []
    for _ in range(2):
        pid, term = wait_until(
            lambda: leader_pid(database_url)[0] and leader_pid(database_url), what="a leader"
        )
        terms.append(term)
        os.kill(pid, signal.SIGKILL)
        wait_until(
            lambda p=pid: leader_pid(database_url)[0] not in (0, p), timeout=60, what="takeover"
        )
    # A paused leader (GC or VM stall), maybe mid-transaction: a follower still takes over.
    pid, term = wait_until(
        lambda: leader_pid(database_url)[0] and leader_pid(database_url), what="a leader"
    )
    terms.append(term)
    os.kill(pid, signal.SIGSTOP)
    try:
        # Paused for good until the takeover: a leader that never steps down fails here.
        wait_until(
            lambda: leader_pid(database_url)[0] not in (0, pid),
            timeout=60,
            what="takeover from the paused leader",
        )
    finally:
        os.kill(pid, signal.SIGCONT)
    terms.append(leader_pid(database_url)[1])
    assert terms == sorted(set(terms))  # terms strictly increase
    wait_until(lambda: live_jobs(database_url) == 0, timeout=60, what="all jobs finished")
    oks = ledger_oks(ledger_dir)
    assert [i for i in ids + delayed if oks[i] != 1] == []
    late = sql(
        database_url,
        "SELECT count(*) FROM hivejobs_archive WHERE id = ANY(%s) AND started_at < run_at",
        (delayed,),
    )
    assert late[0][0] == 0  # no delayed job started before it was due


def test_flushall_while_queued(
    make_app: Callable[..., App],
    start_instance: Callable[..., Instance],
    database_url: str,
    ledger_dir: Path,
    own_redis: RedisServer,
) -> None:
    """S4: FLUSHALL with 2,000 jobs queued loses nothing: the reconciler restores the lists."""
    start_instance(
        {"HJ_TYPES": "alo", "HIVEJOBS_REDIS_URL": own_redis.url, "HJ_CONCURRENCY_ALO": "2"}
    )
    app = fleet_app(make_app, database_url, ["alo"], redis_url=own_redis.url)
    ids = app.enqueue_many("alo", [{"ms": 5}] * 2000)
    wait_until(lambda: count(database_url) >= 50, what="some jobs done")
    client = redis.Redis.from_url(own_redis.url)
    client.flushall()
    wait_until(lambda: client.exists(app.connections.broker.boot_key), timeout=60, what="restore")
    wait_until(lambda: live_jobs(database_url) == 0, timeout=90, what="all jobs finished")
    oks = ledger_oks(ledger_dir)  # read once: the ledger holds a line per attempt
    assert [i for i in ids if oks[i] != 1] == []
    client.close()


def test_redis_paused(
    make_app: Callable[..., App],
    start_instance: Callable[..., Instance],
    database_url: str,
    ledger_dir: Path,
    own_redis: RedisServer,
) -> None:
    """S6: Redis SIGSTOPped for 10 s: no thread hangs, no rescue, enqueues still acknowledged."""
    start_instance(
        {"HJ_TYPES": "alo", "HIVEJOBS_REDIS_URL": own_redis.url, "HJ_CONCURRENCY_ALO": "4"}
    )
    app = fleet_app(
        make_app, database_url, ["alo"], redis_url=own_redis.url, redis_socket_timeout_s=2.0
    )
    ids = app.enqueue_many("alo", [{"ms": 5}] * 2000)
    wait_until(lambda: count(database_url) >= 300, what="some jobs done")
    os.kill(own_redis.pid, signal.SIGSTOP)
    try:
        begun = time.monotonic()
        # Acked while Redis stays paused (PG has them): each push gives up at the socket
        # timeout; without one they would hang until the pytest timeout.
        during = [app.enqueue("alo", {"ms": 1}) for _ in range(3)]
        wait_until(
            lambda: time.monotonic() - begun > 10, timeout=15, interval=0.5, what="the 10 s pause"
        )  # the fault's own duration
    finally:
        os.kill(own_redis.pid, signal.SIGCONT)
    done_at_resume = count(database_url)
    wait_until(
        lambda: count(database_url) > done_at_resume + 100,
        timeout=60,
        what="throughput back after SIGCONT",
    )
    wait_until(lambda: live_jobs(database_url) == 0, timeout=90, what="all jobs finished")
    oks = ledger_oks(ledger_dir)  # read once: the ledger holds a line per attempt
    assert [i for i in ids + during if oks[i] != 1] == []
    assert count(database_url, "error = 'worker lost'") == 0  # no false rescue


def test_rolling_restart(
    make_app: Callable[..., App],
    start_instance: Callable[..., Instance],
    database_url: str,
    ledger_dir: Path,
) -> None:
    """S3: SIGTERM (twice) with long jobs in flight; A exits 0 in time; B finishes everything;
    suspended attempts are not counted; amo jobs that started are failed, never re-run."""
    types = "long_coop,long_stubborn,long_amo,alo"
    a = start_instance({"HJ_TYPES": types})
    app = fleet_app(make_app, database_url, ["long_coop", "long_stubborn", "long_amo", "alo"])
    # The long jobs hold at a gate opened once A is gone: A's are always mid-run at the
    # SIGTERM, and B's re-runs finish at once instead of after a fixed duration.
    coop = app.enqueue_many("long_coop", [{"gate": "longs"}] * 6)
    stubborn = app.enqueue_many("long_stubborn", [{"gate": "longs"}] * 2)
    amo = app.enqueue_many("long_amo", [{"gate": "longs"}] * 4)
    short = app.enqueue_many("alo", [{"ms": 10}] * 2000)
    wait_until(
        lambda: sum(1 for i in coop + stubborn + amo if ledger_starts(ledger_dir)[i]) >= 10,
        what="long jobs running on A",
    )
    a_pids = {p for t in types.split(",") for p in pool_pids(database_url, t)}
    b = start_instance({"HJ_TYPES": types, "HIVEJOBS_SHUTDOWN_TIMEOUT_S": "30"})
    wait_until(lambda: len(pool_pids(database_url, "long_coop")) == 2, what="B's pools")
    a.signal_group(signal.SIGTERM)
    termed = time.monotonic()
    wait_until(lambda: time.monotonic() - termed > 1, interval=0.1, what="1 s")
    a.signal_group(signal.SIGTERM)  # Heroku may send several: no escalation
    # The shutdown timeout (5 s here) bounds the wait for the stubborn jobs, which never end
    # by themselves: without it A would not exit at all. The platform's kill comes at 30 s.
    assert a.wait(30) == 0
    a_exit = time.monotonic_ns()
    assert not [p for p in a_pids if alive(p)]
    # amo jobs A started (B may have started others once its pools were up: those succeed)
    started_amo = {
        p[1]
        for p in read_ledger(ledger_dir)
        if p[0] == "start" and p[1] in amo and int(p[3]) in a_pids
    }
    assert started_amo
    open_gate(app.connections.broker, "longs")
    wait_until(lambda: live_jobs(database_url) == 0, timeout=90, what="B finished everything")

    oks, starts = ledger_oks(ledger_dir), ledger_starts(ledger_dir)
    for job_id in coop + stubborn:
        info = app.get_job(job_id)
        assert info.state == "succeeded" and info.attempt == 1, info
        assert oks[job_id] == 1
    for job_id in amo:
        info = app.get_job(job_id)
        if job_id in started_amo:
            assert (info.state, info.error) == ("failed", "interrupted by shutdown")
        assert starts[job_id] == 1
    assert [i for i in short if oks[i] != 1] == []
    # B never started a suspended job before A's processes were gone.
    b_pids = {int(p[3]) for p in read_ledger(ledger_dir) if p[0] == "start"} - a_pids
    for parts in read_ledger(ledger_dir):
        if parts[0] == "start" and parts[1] in coop and int(parts[3]) in b_pids:
            assert int(parts[4]) <= a_exit + 10**9 * 100
    b.signal_group(signal.SIGTERM)
    assert b.wait(40) == 0


def test_poison_handlers(
    make_app: Callable[..., App],
    start_instance: Callable[..., Instance],
    database_url: str,
    ledger_dir: Path,
) -> None:
    """A hang, an os._exit(1) and a raise each end in the right terminal state, and the
    other jobs of their pools are not held up."""
    start_instance({"HJ_TYPES": "poison,poison_amo"})
    app = fleet_app(make_app, database_url, ["poison", "poison_amo"])
    hang = app.enqueue("poison", {"do": "hang"})
    raises = app.enqueue("poison", {"do": "raise"})
    normal = app.enqueue_many("poison", [{"do": "ok"}] * 1000)
    # The process deaths come after the hang ended, or they would end it as a worker loss.
    wait_until(lambda: app.get_job(hang).state == "failed", timeout=30, what="hang timed out")
    exits = app.enqueue("poison", {"do": "exit"})
    amo_exit = app.enqueue("poison_amo", {"do": "exit"})
    normal += app.enqueue_many("poison", [{"do": "ok"}] * 500)
    normal_amo = app.enqueue_many("poison_amo", [{"do": "ok"}] * 1000)
    wait_until(lambda: live_jobs(database_url) == 0, timeout=90, what="all jobs finished")

    def state(job_id: str) -> tuple[str, str, int]:
        info = app.get_job(job_id)
        return info.state, (info.error or "").strip().splitlines()[-1], info.attempt

    assert state(hang) == ("failed", "timed out after 1s", 3)
    assert state(raises) == ("failed", "ValueError: poison raised", 3)
    assert state(exits)[0] == "failed" and state(exits)[1].startswith("worker lost")
    assert state(amo_exit) == ("failed", "worker lost", 1)
    assert ledger_starts(ledger_dir)[amo_exit] == 1
    # Jobs that shared a process with an os._exit died with it: at-least-once ones ran again,
    # at-most-once ones failed "worker lost"; none started twice.
    states = dict(
        sql(
            database_url,
            "SELECT id, CASE WHEN state = 'succeeded' THEN state "
            "ELSE error END FROM hivejobs_archive",
        )
    )
    assert {states[i] for i in normal} == {"succeeded"}
    assert {states[i] for i in normal_amo} <= {"succeeded", "worker lost"}
    starts = ledger_starts(ledger_dir)
    assert [i for i in normal_amo if starts[i] != 1] == []


def test_instance_killed_whole_is_rescued_by_another(
    make_app: Callable[..., App],
    start_instance: Callable[..., Instance],
    database_url: str,
    ledger_dir: Path,
) -> None:
    """S13b: killpg(A, SIGKILL) (host death, no grace): B's coordinator rescues A's claims
    once their heartbeats are older than stuck_after; alo re-run, amo failed "worker lost"."""
    a = start_instance({"HJ_TYPES": "alo,amo"})
    app = fleet_app(make_app, database_url, ["alo", "amo"])
    a_alo, a_amo = pool_pids(database_url, "alo")[0], pool_pids(database_url, "amo")[0]
    # The jobs wait at a gate opened only after the kill: they are mid-run when A dies,
    # however long B takes to start on a loaded machine.
    alo = app.enqueue_many("alo", [{"gate": "work"}] * 8)
    amo = app.enqueue_many("amo", [{"gate": "work"}] * 4)
    wait_until(
        lambda: (
            len(running_in_pid(ledger_dir, a_alo)) == 8
            and len(running_in_pid(ledger_dir, a_amo)) == 4
        ),
        what="A mid-run",
    )
    start_instance({"HJ_TYPES": "alo,amo"})
    wait_until(lambda: len(pool_pids(database_url, "alo")) == 2, what="B's pools")
    a.signal_group(signal.SIGKILL)
    killed = time.monotonic()
    # A's pools have process groups of their own and die by PDEATHSIG once A's supervisor
    # is gone: open the gate only after that, or their jobs could still finish there.
    wait_until(lambda: not [p for p in (a_alo, a_amo) if alive(p)], what="A's pools gone")
    open_gate(app.connections.broker, "work")
    wait_until(lambda: live_jobs(database_url) == 0, timeout=60, what="B finished everything")
    # Rescue waited for stale heartbeats (stuck_after 5 s), plus B's own R6 health window.
    assert time.monotonic() - killed > 5
    states = dict(sql(database_url, "SELECT id, coalesce(error, state) FROM hivejobs_archive"))
    assert {app.get_job(i).state for i in alo} == {"succeeded"}
    assert {app.get_job(i).attempt for i in alo} == {2}
    assert {states[i] for i in amo} == {"worker lost"}
    assert [i for i in amo if ledger_starts(ledger_dir)[i] != 1] == []
    assert not [p for p in (a_alo, a_amo) if alive(p)]


def test_killed_supervisor_takes_its_children_along(
    make_app: Callable[..., App],
    start_instance: Callable[..., Instance],
    database_url: str,
) -> None:
    """S13a: kill -9 of the supervisor alone: its pools and coordinator exit (parent-death
    signal), so no orphan keeps heartbeating with nobody to restart it."""
    inst = start_instance({"HJ_TYPES": "alo,amo"})
    fleet_app(make_app, database_url, ["alo", "amo"])
    rows = wait_until(
        lambda: (r := sql(database_url, "SELECT pid FROM hivejobs_worker")) and len(r) == 3 and r,
        what="two pools and a coordinator",
    )
    children = [int(r[0]) for r in rows]
    os.kill(inst.pid, signal.SIGKILL)
    # Nothing but the parent-death signal ends them: without it they would run on.
    wait_until(lambda: not [p for p in children if alive(p)], timeout=60, what="children gone")


def test_garbage_in_redis_lists_is_skipped(
    make_app: Callable[..., App],
    start_instance: Callable[..., Instance],
    database_url: str,
    ledger_dir: Path,
) -> None:
    """Foreign writes to a queue list (random ids, a pickle blob, a 10 MB value, invalid
    UTF-8) are never claimed or executed, and the pool keeps running."""
    start_instance({"HJ_TYPES": "alo"})
    app = fleet_app(make_app, database_url, ["alo"])
    pid = pool_pids(database_url, "alo")[0]
    key = app.connections.broker.queue_key("alo", 0)
    garbage = [os.urandom(16).hex() for _ in range(10_000)]
    app.connections.broker.redis.rpush(key, *garbage)
    app.connections.broker.redis.rpush(
        key,
        b"\x80\x04\x95cos\nsystem\n",
        b"../../etc/passwd",
        b"\xff\xfe",
        b"x" * (10 * 1024 * 1024),
    )
    ids = app.enqueue_many("alo", [{"ms": 1}] * 200)
    wait_until(lambda: live_jobs(database_url) == 0, timeout=60, what="real jobs done")
    oks = ledger_oks(ledger_dir)  # read once: the ledger holds a line per attempt
    assert [i for i in ids if oks[i] != 1] == []
    assert app.connections.broker.redis.llen(key) == 0
    assert pool_pids(database_url, "alo") == [pid]  # the same process: nothing crashed
