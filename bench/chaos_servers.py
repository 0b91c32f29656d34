"""Chaos scenarios that hurt what hivejobs stands on (RELIABILITY.md S5 Postgres restarted,
crashed, connections killed; S10 clock skew; S11 a 1M backlog). S14 is in chaos_chains.py,
S15 in chaos_partition.py.

S5 runs a Postgres cluster of its own (initdb, pg_ctl, a free port): the shared server is never
restarted. S11 uses a redis-server of its own, to measure its memory and flush it.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import redis
from bench.chaoslib import Row, Scenario, leader, pause, scaled
from bench.harness import (
    PostgresServer,
    RedisServer,
    pool_pids,
    read_ledger,
    sql,
    wait_until,
)

from hivejobs import App, HivejobsError
from hivejobs.logs import MSG_LIBRARY
from hivejobs.store import QUERIES

# -- S5 --------------------------------------------------------------------------------


class Enqueuer:
    """A client thread adding `rate` jobs/s, recording each call as acked or errored."""

    def __init__(self, app: App, rate: float = 20.0, name: str = "alo") -> None:
        self.app, self.rate, self.name = app, rate, name
        self.acked: list[str] = []
        self.errored: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        n = 0
        while not self.stop.wait(1 / self.rate):
            job_id = f"steady-{n}"
            n += 1
            try:
                self.acked.append(self.app.enqueue(self.name, {"ms": 1}, id=job_id))
            except HivejobsError:
                self.errored.append(job_id)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(60)


def _pg_scenario(name: str, scale: float, faults: str) -> Row:
    pg = PostgresServer()
    s = Scenario(name, admin_url=pg.url)
    slow = {"HIVEJOBS_STUCK_AFTER_S": "15"}
    try:
        # A log shipper's format: psycopg's pool logs through `logging` in these faults.
        inst = s.instance("alo,amo", HIVEJOBS_LOG_FORMAT="json", **slow)
        app = s.app(["alo", "amo"], stuck_after_s=15.0)
        n = scaled(10_000, scale, 300)
        alo = app.enqueue_many("alo", [{"ms": 5}] * n)
        amo = app.enqueue_many("amo", [{"ms": 5}] * (n // 10))
        steady = Enqueuer(app)
        try:
            if faults == "restart,crash,kill":
                s.wait_done(n * 0.3)
                pg.restart_fast()
                s.progress_after(time.monotonic())
                s.wait_done(n * 0.6)
                pg.stop_immediate()
                pause(8)  # down 8 s
                pg.start()
                back_ns = time.monotonic_ns()  # a run that started before was claimed before
                s.progress_after(time.monotonic())
                s.wait_done(n * 0.8)
                at = time.monotonic()
                for _ in range(5):
                    pg.terminate_backends()
                    pause(1)
                s.progress_after(at)
            else:  # down 20 s: longer than stuck_after
                s.wait_done(n * 0.3)
                pg.stop_immediate()
                pause(20)
                pg.start()
                back_ns = time.monotonic_ns()  # a run that started before was claimed before
                s.progress_after(time.monotonic())
        finally:
            steady.close()
        row = s.result(alo=alo + steady.acked, amo=amo, timeout=180, rerun_across=back_ns)
        # An errored call may have committed (ambiguous COMMIT): then it is stored once (the
        # id is the key) and must end like any other job.
        final = s.archived()
        ambiguous = [i for i in steady.errored if i in final]
        s.check(all(final[i][0] == "succeeded" for i in ambiguous), "a stored errored job failed")
        false = sql(s.url, "SELECT count(*) FROM hivejobs_archive WHERE error LIKE 'worker lost%%'")
        s.check(false[0][0] == 0, f"{false[0][0]} false rescues (the processes stayed alive)")
        deaths = inst.log_text().count("child died")
        lines = [
            json.loads(line)["record"] for line in inst.log_text().splitlines() if line[:1] == "{"
        ]
        library = [r["extra"]["library"] for r in lines if r["message"] == MSG_LIBRARY]
        s.check(
            bool(library) and all(name.startswith("psycopg") for name in library),
            f"psycopg's logging did not come through loguru as JSON: {sorted(set(library))}",
        )
        s.check(deaths <= 3 * 3, f"{deaths} child restarts (a crash loop)")
        s.check(inst.proc.poll() is None, "the supervisor exited")
        notes = (
            f"{len(steady.acked)} acked / {len(steady.errored)} refused "
            f"({len(ambiguous)} of those stored anyway); {s.reruns} alo re-runs across the "
            "crash (asynchronous commit lost, by design); "
            f"{deaths} child restarts"
        )
        return s.rejudge(row, notes=notes)
    finally:
        s.close()
        pg.close()


def postgres_faults(scale: float) -> Row:
    """S5 (a-c): restart -m fast at 30 %, crash + 8 s down at 60 %, every backend killed 5
    times at 80 %, while a client enqueues 20 jobs/s."""
    return _pg_scenario("S5 PG restart, crash, kill", scale, "restart,crash,kill")


def postgres_long_outage(scale: float) -> Row:
    """S5 (d): Postgres down 20 s, longer than stuck_after (15 s): still no false rescue."""
    return _pg_scenario("S5d PG down 20 s", scale * 0.3, "down20")


# -- S10 -------------------------------------------------------------------------------

SKEW_DIR = Path(__file__).resolve().parent / "skew"  # the skewed instance's sitecustomize
LIBFAKETIME_GLOB = "/usr/lib/*/faketime/libfaketime.so.1"  # Debian's faketime, any arch


def libfaketime() -> str:
    """The path of libfaketime, installed first (Debian's `faketime`) when missing, as
    scripts/test installs the servers it needs: the scenario runs on a fresh machine."""
    found = sorted(glob.glob(LIBFAKETIME_GLOB))
    if not found and shutil.which("apt-get"):
        sudo = [] if os.geteuid() == 0 else ["sudo"]
        for argv in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "faketime"]):
            subprocess.run([*sudo, *argv], check=False, timeout=600)
        found = sorted(glob.glob(LIBFAKETIME_GLOB))
    if not found:
        raise RuntimeError("libfaketime missing: apt-get install -y faketime")
    return found[0]


def clock_skew(scale: float) -> list[Row]:
    """S10: instance B's wall clock is +300 s (then -300 s) off, and B is the leader. No
    rescue, no leadership flapping, delayed and retried jobs start on time on DB time."""
    return [_skewed(offset, scale) for offset in ("+300s", "-300s")]


def _skewed(offset: str, scale: float) -> Row:
    s = Scenario(f"S10 clock skew {offset}")
    types = "alo,retry_once"
    try:
        # The wall clock alone is skewed, as on a host whose NTP is off: the monotonic clock
        # stays true (faked, it stalled the instance's timed waits). bench/skew/ gives that
        # instance a time.sleep that libfaketime does not break (see its sitecustomize.py).
        skew = {
            "LD_PRELOAD": libfaketime(),
            "FAKETIME": offset,
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            "PYTHONPATH": os.pathsep.join([str(SKEW_DIR), s.env("")["PYTHONPATH"]]),
        }
        s.instance(types, **skew)
        wait_until(lambda: leader(s.url)[0], timeout=60, what="B leads")
        skewed_leader = leader(s.url)[0]
        s.instance(types)
        app = s.app(["alo", "retry_once"])
        wait_until(lambda: len(pool_pids(s.url, "alo")) == 2, timeout=60, what="A and B")
        n = scaled(2000, scale, 200)
        alo = app.enqueue_many("alo", [{"ms": 5}] * (n - n // 4 - n // 10))
        # Due 5 s on, spread over 25 s at full size (2.5 s at CI size: the spread is waiting).
        spread = 25 * min(1.0, scale * 10)
        delayed = [
            app.enqueue("alo", {"ms": 1}, delay=5 + spread * i / max(1, n // 4))
            for i in range(n // 4)
        ]
        retried = app.enqueue_many("retry_once", [{"delay": 2.0}] * (n // 10))
        terms: set[int] = set()
        stop = threading.Event()

        def watch() -> None:
            while not stop.wait(0.5):
                terms.add(leader(s.url)[1])

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            row = s.result(alo=alo + delayed + retried, timeout=180)
        finally:
            stop.set()
            watcher.join(5)
        terms.discard(0)
        s.check(len(terms) <= 2, f"leadership changed {len(terms) - 1} times")
        s.check(leader(s.url)[0] == skewed_leader, "the skewed leader lost the lease")
        late = sql(
            s.url,
            "SELECT count(*) FILTER (WHERE started_at < run_at),"
            " count(*) FILTER (WHERE started_at > run_at + interval '2 s'),"
            " max(extract(epoch FROM started_at - run_at))"
            " FROM hivejobs_archive WHERE id = ANY(%s)",
            (delayed + retried,),
        )[0]
        s.check(late[0] == 0, f"{late[0]} delayed/retried jobs started before they were due")
        s.check(late[1] == 0, f"{late[1]} delayed/retried jobs started > 2 s late")
        rescued = sql(s.url, "SELECT count(*) FROM hivejobs_archive WHERE error LIKE 'worker%%'")
        s.check(rescued[0][0] == 0, f"{rescued[0][0]} rescues")
        return s.rejudge(row, notes=f"max start delay {float(late[2] or 0):.2f} s after due")
    finally:
        s.close()


# -- S11 -------------------------------------------------------------------------------


def backlog(scale: float) -> Row:
    """S11: 1M queued no-op jobs (4 types x 2 priorities) enqueued with workers stopped; Redis
    memory; a FLUSHALL restored by the reconciler while pools run; throughput with the
    backlog vs on an empty database; query times and plans; the database dropped."""
    server = RedisServer(Path(tempfile.mkdtemp(prefix="hjchaos-redis-")))
    types = [f"noop{i}" for i in range(4)]
    s = Scenario("S11 1M backlog", server.url)
    try:
        app = _declaring_app(s, types)
        total = scaled(1_000_000, scale, 20_000)
        began = time.monotonic()
        for k in range(0, total, 10_000):
            name, prio = types[(k // 10_000) % 4], (k // 40_000) % 2
            app.enqueue_many(name, [{}] * min(10_000, total - k), priority=prio)
        app.flush(60)
        rate = total / (time.monotonic() - began)
        used_mb = int(redis.Redis.from_url(server.url).info("memory")["used_memory"]) / 2**20
        s.check(used_mb < 150 * max(scale, 0.1), f"Redis uses {used_mb:.0f} MB")
        # Plans and timings while the whole backlog is queued.
        timings, plans = _query_checks(s, app)
        s.check(max(timings.values()) <= 1.0, f"slow queries: {timings}")
        s.check(not plans, f"Seq Scan on hivejobs_job in {plans}")
        baseline = _empty_db_throughput(scale)
        s.instance(",".join(types))
        wait_until(lambda: all(pool_pids(s.url, t) for t in types), timeout=60, what="pools")
        s.wait_done(2000, timeout=120)  # warm, as the baseline was
        # FLUSHALL with the pools running: the reconciler restores every list.
        client = redis.Redis.from_url(server.url)
        queued = sql(s.url, "SELECT count(*) FROM hivejobs_job WHERE state = 'queued'")[0][0]
        done_at_flush = s.done()
        client.flushall()
        at = time.monotonic()
        keys = [app.connections.broker.queue_key(t, p) for t in types for p in (0, 1)]
        starts_before = len(read_ledger(s.ledger))
        s.recovery(
            at,
            lambda: sum(client.llen(k) for k in keys) + s.done() - done_at_flush >= queued * 0.95,
            "lists restored",
            timeout=120,
        )
        s.check(len(read_ledger(s.ledger)) > starts_before, "no job ran during the restore")
        window = max(10.0, 60 * scale)
        before = s.done()
        pause(window)
        with_backlog = (s.done() - before) / window
        ratio = with_backlog / baseline
        s.check(ratio >= 0.8, f"throughput with the backlog is {ratio:.2f} of an empty DB's")
        notes = (
            f"enqueue {rate:,.0f}/s; Redis {used_mb:.0f} MB; {with_backlog:.0f}/s vs "
            f"{baseline:.0f}/s empty; "
            + ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in timings.items())
        )
        return s.rejudge(_backlog_row(s, total), notes=notes)
    finally:
        s.close()
        server.stop()


def _declaring_app(s: Scenario, types: list[str]) -> App:
    """An App that declares the no-op types itself (no workers run while it enqueues)."""
    app = App(database_url=s.url, redis_url=s.redis_url, prefix=s.prefix)
    for name in types:
        app.job(name, concurrency=8)(_noop_handler)
    app.connections.store.upsert_job_types([jt.info() for jt in app.types.values()])
    s.apps.append(app)
    return app


def _noop_handler(ctx: object, payload: object) -> None:
    return None


def _empty_db_throughput(scale: float) -> float:
    """Jobs/s of the same pools draining a fresh database (the S11 baseline)."""
    types = [f"noop{i}" for i in range(4)]
    s = Scenario("S11 baseline")
    try:
        s.instance(",".join(types))
        app = s.app(types)
        n = scaled(40_000, scale, 4_000)
        for name in types:
            app.enqueue_many(name, [{}] * (n // 4))
        wait_until(lambda: s.done() >= n // 10, timeout=120, what="warm")
        began, base = time.monotonic(), s.done()
        wait_until(lambda: s.done() >= n * 0.9, timeout=300, interval=0.2, what="drain")
        return (s.done() - base) / (time.monotonic() - began)
    finally:
        s.close()


# The statements whose plans S11 checks against the backlog (no Seq Scan on hivejobs_job).
PLAN_CHECKED = (
    "promote_due",
    "end_waiting_jobs",
    "find_dead_workers",
    "rescue_requeue",
    "queued_page",
    "queued_counts",
    "stale_queued",
)
# A value for each parameter those statements may take. What each one takes is read from its
# text (plan_params), so a statement that gains a parameter is named at once here rather than
# kept with an old statement's list.
SAMPLE_PARAMS: dict[str, object] = {
    "limit": 10_000,
    "stuck_after_s": 30.0,
    "after_at": "-infinity",
    "after_id": "",
    "name": "noop0",
    "priority": 0,
    "grace_s": 5.0,
    "before": None,  # an empty Redis list: no head, before now
    "worker_ids": [],
    "poison_after": 3,
}


def plan_params(name: str) -> dict[str, object]:
    """The parameters statement `name` takes, with sample values; KeyError naming any without
    one."""
    wanted = set(re.findall(r"%\((\w+)\)s", QUERIES[name]))
    missing = sorted(wanted - SAMPLE_PARAMS.keys())
    if missing:
        raise KeyError(f"no sample value for {missing} of {name}: add them to SAMPLE_PARAMS")
    return {k: SAMPLE_PARAMS[k] for k in wanted}


def _query_checks(s: Scenario, app: App) -> tuple[dict[str, float], list[str]]:
    timings: dict[str, float] = {}
    one = sql(s.url, "SELECT id FROM hivejobs_job LIMIT 1")[0][0]
    env = s.env("")
    for label, argv in (("hivejobs jobs", ["jobs"]), ("hivejobs status", ["status", one])):
        t = time.monotonic()
        subprocess.run(
            [sys.executable, "-m", "hivejobs", *argv], env=env, capture_output=True, timeout=60
        )
        timings[label] = time.monotonic() - t - _python_start_s(env)
    t = time.monotonic()
    app.get_job(one)
    timings["get_job"] = time.monotonic() - t
    seq: list[str] = []
    for name in PLAN_CHECKED:
        t = time.monotonic()
        plan = sql(s.url, "EXPLAIN (FORMAT JSON) " + QUERIES[name], plan_params(name))[0][0]
        timings[name] = time.monotonic() - t
        if _seq_scans(plan):
            seq.append(name)
    return timings, seq


_PYTHON_START: list[float] = []


def _python_start_s(env: dict[str, str]) -> float:
    """What `hivejobs --help` costs (interpreter and imports), taken off CLI timings."""
    if not _PYTHON_START:
        t = time.monotonic()
        cmd = [sys.executable, "-m", "hivejobs", "--help"]
        subprocess.run(cmd, env=env, capture_output=True, timeout=60)
        _PYTHON_START.append(time.monotonic() - t)
    return _PYTHON_START[0]


def _seq_scans(plan: object) -> bool:
    stack = [plan]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if item.get("Node Type") == "Seq Scan" and item.get("Relation Name") == "hivejobs_job":
                return True
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def _backlog_row(s: Scenario, total: int) -> Row:
    return {
        "scenario": s.name,
        "jobs": total,
        "lost": "-",
        "twice": "-",
        "rescued": "-",
        "recovery_s": round(max(s.recoveries), 1) if s.recoveries else "-",
        "time_s": round(time.monotonic() - s.started, 1),
        "result": "",
        "notes": "",
    }
