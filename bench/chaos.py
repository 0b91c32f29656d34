"""Fault scenarios at scale (RELIABILITY.md section 4, "chaos" sizes), with a result table.

    python bench/chaos.py [--scale 1.0] [--only kill_pool,redis,...] [--markdown]

Each scenario runs real `hivejobs run` instances (tests/apps/faultapp.py) against a fresh
database, a Redis key prefix (or a redis-server of its own when Redis itself is hurt), injects
its faults with real signals and commands, and checks from Postgres and the handlers' ledger:
lost = enqueued jobs that did not end as expected; twice = at-least-once jobs that ran to
completion twice outside killed processes, plus at-most-once jobs started twice; recovery_s =
the longest time from a fault to its recovery condition (see each scenario); result = pass or
FAIL with the reasons. The scenarios live in bench/chaos*.py; tests/process/test_fault_plan.py
runs the CI-size ones through the same checker (bench/chaoslib.py).
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import redis
from loguru import logger

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import (  # noqa: E402
    chaos_chains,
    chaos_clients,
    chaos_partition,
    chaos_procs,
    chaos_servers,
)
from bench.chaos_keys import KEYED_TYPES, Keyed  # noqa: E402
from bench.chaoslib import COLUMNS, Row, Scenario, error_row, leader, scaled  # noqa: E402
from bench.harness import (  # noqa: E402
    RedisServer,
    pool_pids,
    running_in_pid,
    sql,
    wait_until,
)


def kill_pool(scale: float) -> Row:
    """S1 chaos: a pool process kill -9 every 5 s, alternating pools (the sequenced type's
    first), while 25k jobs drain, and 2k fair and 6.25k sequenced ones (5 keys)."""
    return _kill_pools("S1 kill -9 pool every 5 s", {}, int(20000 * scale), int(5000 * scale))


def kill_serial_pool(scale: float) -> Row:
    """S1b chaos: S1 with one runner per type (serialised types): the jobs a killed pool held
    re-run alone, and the one runner of the new pool must hand back the neighbours it
    fetched ahead itself. 2,500 jobs: one runner drains ~45 a second."""
    return _kill_pools(
        "S1b kill -9 one-runner pool every 5 s",
        {f"HJ_CONCURRENCY_{t.upper()}": "1" for t in KILLED_TYPES + KEYED_TYPES},
        int(2000 * scale),
        int(500 * scale),
    )


# Each delivery with a `def` and an `async def` handler, a pool each: the kills alternate.
KILLED_TYPES = ["alo", "amo", "alo_async", "amo_async"]


def _kill_pools(title: str, env: dict[str, str], n_alo: int, n_amo: int) -> Row:
    s = Scenario(title)
    try:
        kinds = KEYED_TYPES[:1] + KILLED_TYPES + KEYED_TYPES[1:]  # the kills' rotation
        s.instance(",".join(kinds), **env)
        app = s.app(kinds)
        rng = random.Random(1)
        alo: list[str] = []
        amo: list[str] = []
        for suffix in ("", "_async"):  # half of each delivery's jobs for each kind
            alo += app.enqueue_many(
                "alo" + suffix, [{"ms": rng.randint(5, 40)} for _ in range(n_alo // 2)]
            )
            amo += app.enqueue_many("amo" + suffix, [{"ms": 20}] * (n_amo // 2))
        # Sequenced lines long enough (50 ms a job on average, one at a time per key: 6 s
        # and more at CI size) to be in flight at the first kill, which hits their pool.
        keyed = Keyed()
        keyed.enqueue(app, 5, n_alo // 10, n_alo // 16, (30, 70), rng)
        k = 0
        while s.live() > 0:
            deadline = time.monotonic() + 5
            wait_until(
                lambda d=deadline: time.monotonic() > d or s.live() == 0,
                interval=0.2,
                what="next kill",
            )  # the fault's own period
            kind = kinds[k % len(kinds)]
            pids = pool_pids(s.url, kind)
            if pids and kind == KEYED_TYPES[0]:
                # A key's jobs run one at a time with hand-overs between them: wait for one
                # mid-run in this pool, so the kill meets a sequence (while any is left).
                wait_until(
                    lambda p=pids[0]: running_in_pid(s.ledger, p) or not keyed_live(s.url),
                    interval=0.02,
                    what="a sequenced job mid-run",
                )
            if pids and running_in_pid(s.ledger, pids[0]):
                s.kill(pids[0])
                s.recovery(  # R8: the supervisor releases the dead pool's claims at once
                    time.monotonic(),
                    lambda p=pids[0]: (
                        not sql(
                            s.url,
                            "SELECT 1 FROM hivejobs_job j JOIN hivejobs_worker w"
                            " ON w.id = j.worker_id WHERE w.pid = %s",
                            (p,),
                        )
                    ),
                    "orphans released",
                )
            k += 1
        return keyed.judge(s, s.result(alo + keyed.ids, amo))
    finally:
        s.close()


def keyed_live(url: str) -> bool:
    """Whether a sequenced job of the keyed lines is still to run or running."""
    return bool(sql(url, "SELECT 1 FROM hivejobs_job WHERE name = %s LIMIT 1", (KEYED_TYPES[0],)))


def kill_coordinator(scale: float) -> Row:
    """S2 chaos: two instances; kill -9 the leader's coordinator 3 times, then SIGSTOP it."""
    s = Scenario("S2 kill -9 / SIGSTOP leader")
    try:
        s.instance("alo")
        s.instance("alo")
        app = s.app(["alo"])
        wait_until(lambda: len(pool_pids(s.url, "alo")) == 2, what="two instances")
        alo = app.enqueue_many("alo", [{"ms": 10}] * int(10000 * scale))
        alo += [
            app.enqueue("alo", {"ms": 1}, delay=random.uniform(2, 20))
            for _ in range(int(500 * scale))
        ]
        for round_ in range(4):
            rows = wait_until(
                lambda: sql(
                    s.url,
                    "SELECT w.pid FROM hivejobs_leader l JOIN "
                    "hivejobs_worker w ON w.id = l.holder "
                    "WHERE l.expires_at > now()",
                ),
                what="leader",
            )
            pid = int(rows[0][0])
            at = time.monotonic()
            if round_ < 3:
                s.kill(pid)
            else:
                os.kill(pid, signal.SIGSTOP)
                wait_until(
                    lambda p=pid: sql(
                        s.url,
                        "SELECT 1 FROM hivejobs_leader l JOIN "
                        "hivejobs_worker w ON w.id = l.holder "
                        "WHERE w.pid <> %s",
                        (p,),
                    ),
                    timeout=20,
                    what="takeover from the paused leader",
                )
                os.kill(pid, signal.SIGCONT)
            s.recovery(
                at,
                lambda p=pid: leader(s.url)[0] not in (0, p),
                "new leader",
                timeout=20,
            )
        return s.result(alo, [])
    finally:
        s.close()


def redis_faults(scale: float) -> Row:
    """S4 chaos: FLUSHALL at 25 %, SHUTDOWN NOSAVE + restart at 60 %, CLIENT KILL at 80 %
    (of all jobs: 20k, and 2k fair and 6.25k sequenced ones, 5 keys, whose lines drain
    about as long as the rest); jobs of each kind enqueued while Redis is down."""
    server = RedisServer(Path(tempfile.mkdtemp(prefix="hjchaos-redis-")))
    s = Scenario("S4 Redis flush, restart, client kill", server.url)
    try:
        s.instance(",".join(["alo", *KEYED_TYPES]), HJ_CONCURRENCY_ALO="4")
        app = s.app(["alo", *KEYED_TYPES])
        n = int(20000 * scale)
        alo = app.enqueue_many("alo", [{"ms": 2}] * n)
        keyed = Keyed()
        keyed.enqueue(app, 5, n // 10, n // 16, (1, 5), random.Random(4))
        n = len(alo) + len(keyed.ids)
        client = redis.Redis.from_url(server.url)
        wait_until(lambda: s.done() >= n * 0.25, timeout=120, what="25 %")
        keyed.note_fault(s)
        client.flushall()
        s.progress_after(time.monotonic())
        wait_until(lambda: s.done() >= n * 0.6, timeout=120, what="60 %")
        keyed.note_fault(s)
        try:
            client.shutdown(nosave=True)
        except redis.ConnectionError:
            pass
        alo += [app.enqueue("alo", {"ms": 1}) for _ in range(int(1000 * scale))]  # Redis down
        keyed.enqueue(
            app, 5, int(100 * scale), int(200 * scale) // 5, (1, 2), random.Random(5), False
        )
        server.start()
        s.progress_after(time.monotonic())
        wait_until(lambda: s.done() >= n * 0.8, timeout=120, what="80 %")
        keyed.note_fault(s)
        client = redis.Redis.from_url(server.url)
        client.client_kill_filter(_type="normal")
        s.progress_after(time.monotonic())
        return keyed.judge(s, s.result(alo + keyed.ids, []))
    finally:
        s.close()
        server.stop()


def redis_pause(scale: float) -> Row:
    """S6 chaos: Redis SIGSTOPped for 10 s at 30 % and 20 s at 60 %."""
    server = RedisServer(Path(tempfile.mkdtemp(prefix="hjchaos-redis-")))
    s = Scenario("S6 Redis SIGSTOP 10 s + 20 s", server.url)
    try:
        s.instance("alo")
        app = s.app(["alo"])
        n = int(10000 * scale)
        alo = app.enqueue_many("alo", [{"ms": 5}] * n)
        for at, pause in ((0.3, 10), (0.6, 20)):
            wait_until(lambda a=at: s.done() >= n * a, timeout=120, what=f"{at:.0%}")
            os.kill(server.pid, signal.SIGSTOP)
            begun = time.monotonic()
            wait_until(
                lambda b=begun, p=pause: time.monotonic() - b > p,
                timeout=pause + 5,
                interval=0.5,
                what="the pause",
            )  # the fault's own duration
            os.kill(server.pid, signal.SIGCONT)
            s.progress_after(time.monotonic())
        return s.result(alo, [])
    finally:
        s.close()
        server.stop()


def rolling_restarts(scale: float) -> Row:
    """S3 chaos: A -> B -> A handovers by SIGTERM with long and short jobs in flight, `def`
    and `async def` handlers, and fair and sequenced ones (5 keys of 50-200 ms jobs, lines
    long enough to be in flight at the handovers)."""
    s = Scenario("S3 rolling restart x3")
    names = ["long_coop", "long_stubborn", "alo", "long_coop_async", "alo_async", *KEYED_TYPES]
    types = ",".join(names)
    try:
        current = s.instance(types)
        app = s.app(names)
        rng = random.Random(3)
        alo = app.enqueue_many("alo", [{"ms": 10}] * int(10000 * scale))
        alo += app.enqueue_many("alo_async", [{"ms": 10}] * int(10000 * scale))
        # Two rounds of each long type's runners at least: long jobs stay in flight across
        # the three handovers (the full size keeps ~7 rounds: 53 s of 8 s jobs). The async
        # ones stop as a cancelled task; the stubborn ones ignore the stop.
        alo += app.enqueue_many("long_coop", [{"s": 8}] * scaled(40, scale, 12))
        alo += app.enqueue_many("long_coop_async", [{"s": 8}] * scaled(40, scale, 12))
        alo += app.enqueue_many("long_stubborn", [{"s": 8}] * scaled(10, scale, 4))
        keyed = Keyed()
        keyed.enqueue(app, 5, int(2000 * scale), scaled(250, scale, 100), (50, 200), rng)
        stopped: set[int] = set()
        for _ in range(3):
            nxt = s.instance(types)
            wait_until(lambda: len(pool_pids(s.url, "alo")) == 2, what="next instance")
            leaving = {t: pool_pids(s.url, t, host_pid=current.pid) for t in names}
            stopped.update(p for pids in leaving.values() for p in pids)
            keyed.note_fault(s)
            current.signal_group(signal.SIGTERM)
            at = time.monotonic()
            s.check(current.wait(15) == 0, "a supervisor exited non-zero on SIGTERM")
            s.exited(leaving["alo_seq"])
            s.progress_after(at, 20)
            current = nxt
        return keyed.judge(s, s.result(alo + keyed.ids, [], stopped=stopped))
    finally:
        s.close()


Runner = Callable[[float], Row | list[Row]]
SCENARIOS: dict[str, Runner] = {
    "kill_pool": kill_pool,  # S1
    "kill_serial_pool": kill_serial_pool,  # S1b, one runner per type
    "kill_coordinator": kill_coordinator,  # S2
    "rolling": rolling_restarts,  # S3
    "redis": redis_faults,  # S4
    "postgres": chaos_servers.postgres_faults,  # S5
    "postgres_down_20s": chaos_servers.postgres_long_outage,  # S5 (d)
    "redis_pause": redis_pause,  # S6
    "duplicate_ids": chaos_clients.duplicate_ids,  # S7
    "poison": chaos_procs.poison,  # S8
    "bad_input": chaos_clients.bad_input,  # S9
    "clock_skew": chaos_servers.clock_skew,  # S10
    "backlog": chaos_servers.backlog,  # S11
    "burst": chaos_clients.burst,  # S12
    "kill_instance": chaos_procs.kill_instance,  # S13
    "chain_coordinator": chaos_chains.chain_coordinator_faults,  # S14
    "partition": chaos_partition.partition,  # S15
    "failpoints": chaos_procs.failpoint_matrix,  # S16, 11 failpoints x 3 actions
    "failpoints_exit": lambda scale: chaos_procs.failpoint_matrix(scale, ("exit",)),
    "failpoints_raise": lambda scale: chaos_procs.failpoint_matrix(scale, ("raise",)),
    "failpoints_sleep": lambda scale: chaos_procs.failpoint_matrix(scale, ("sleep:6",)),
}


def table(rows: list[Row], markdown: bool = False) -> str:
    cells = [[str(r.get(c, "")) for c in COLUMNS] for r in rows]
    if markdown:
        lines = ["| " + " | ".join(COLUMNS) + " |", "|" + " --- |" * len(COLUMNS)]
        return "\n".join(lines + ["| " + " | ".join(c) + " |" for c in cells])
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(COLUMNS)]
    out = [COLUMNS, *cells]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="multiply job counts")
    # By default the plan once, S1 to S16: the failpoints_* entries split S16's matrix by
    # action for separate runs, and would run its 33 cells a second time.
    plan = [name for name in SCENARIOS if not name.startswith("failpoints_")]
    parser.add_argument("--only", default=",".join(plan), help="comma-separated scenarios")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    args = parser.parse_args()
    logger.disable("hivejobs")  # a library here: the instances' logs are in their own files
    # SIGTERM unwinds like Ctrl-C, so each scenario's finally stops the instances it started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    rows: list[Row] = []
    for name in args.only.split(","):
        print(f"running {name} ...", file=sys.stderr, flush=True)
        try:
            got = SCENARIOS[name](args.scale)
            rows += got if isinstance(got, list) else [got]
        except Exception as exc:  # noqa: BLE001 - report and go on with the others
            traceback.print_exc()
            rows.append(error_row(name, exc))
        print(rows[-1], file=sys.stderr, flush=True)
    print(table(rows, args.markdown))
    return 1 if any(r["result"] != "pass" for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
