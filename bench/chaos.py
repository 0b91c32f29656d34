"""Fault scenarios at scale (RELIABILITY.md section 4, "chaos" sizes), with a result table.

    python bench/chaos.py [--scale 1.0] [--only kill_pool,flush,...]

Each scenario runs real `hivejobs run` instances (tests/apps/faultapp.py) against a fresh
database, a Redis key prefix (or a redis-server of its own when Redis itself is hurt), injects
its faults with real signals and commands, and checks from Postgres and the handlers' ledger:
lost = enqueued jobs that did not end as expected; duplicated = at-least-once jobs that ran
to completion twice outside killed processes, plus at-most-once jobs started twice.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import psycopg
import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.harness import (  # noqa: E402
    FAST_SETTINGS,
    REDIS_URL,
    Instance,
    RedisServer,
    db_url,
    ledger_oks,
    ledger_starts,
    pg_admin_url,
    pool_pids,
    running_in_pid,
    sql,
    wait_until,
)

from hivejobs import App  # noqa: E402


class Scenario:
    """A fresh database, prefix and ledger; instances started here are killed at the end."""

    def __init__(self, name: str, redis_url: str = REDIS_URL) -> None:
        self.name = name
        self.admin = pg_admin_url()
        self.dbname = f"hjchaos_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(self.admin, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{self.dbname}"')
        self.url = db_url(self.admin, self.dbname)
        self.redis_url = redis_url
        self.prefix = f"hjchaos:{uuid.uuid4().hex[:8]}:"
        self.tmp = Path(tempfile.mkdtemp(prefix="hjchaos-"))
        self.ledger = self.tmp / "ledger"
        self.ledger.mkdir()
        App(database_url=self.url, redis_url=redis_url).migrate()
        self.instances: list[Instance] = []
        self.killed: set[int] = set()
        self.started = time.monotonic()

    def instance(self, types: str, **env: str) -> Instance:
        full = dict(os.environ)
        full.update(
            {
                "HIVEJOBS_DATABASE_URL": self.url,
                "HIVEJOBS_REDIS_URL": self.redis_url,
                "HIVEJOBS_PREFIX": self.prefix,
                "HJ_LEDGER": str(self.ledger),
                "HJ_TYPES": types,
                "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
                "HIVEJOBS_TESTING": "1",
            }
        )
        full.update({"HIVEJOBS_" + k.upper(): str(v) for k, v in FAST_SETTINGS.items()})
        full.update(env)
        inst = Instance(full, self.tmp / f"instance{len(self.instances)}.log")
        self.instances.append(inst)
        return inst

    def app(self, types: list[str]) -> App:
        wait_until(lambda: all(pool_pids(self.url, t) for t in types), what="pools")
        app = App(database_url=self.url, redis_url=self.redis_url, prefix=self.prefix)
        app.types.clear()  # enqueue through the types the fleet declared
        return app

    def live(self) -> int:
        return int(sql(self.url, "SELECT count(*) FROM hivejobs_job")[0][0])

    def done(self) -> int:
        return int(sql(self.url, "SELECT count(*) FROM hivejobs_archive")[0][0])

    def kill(self, pid: int) -> None:
        os.kill(pid, signal.SIGKILL)
        self.killed.add(pid)

    def result(self, alo: list[str], amo: list[str], timeout: float = 300) -> dict[str, object]:
        wait_until(lambda: self.live() == 0, timeout=timeout, interval=0.5, what="all done")
        elapsed = time.monotonic() - self.started
        states = dict(sql(self.url, "SELECT id, state FROM hivejobs_archive"))
        oks, survivors = ledger_oks(self.ledger), ledger_oks(self.ledger, self.killed)
        starts = ledger_starts(self.ledger)
        lost = sum(1 for i in alo if states.get(i) != "succeeded" or oks[i] < 1)
        lost += sum(1 for i in amo if i not in states)
        duplicated = sum(1 for i in alo if survivors[i] > 1)
        duplicated += sum(1 for i in amo if starts[i] > 1)
        rescued = int(
            sql(
                self.url,
                "SELECT count(*) FROM hivejobs_archive "
                "WHERE attempt > 1 OR error LIKE 'worker lost%%'",
            )[0][0]
        )
        return {
            "scenario": self.name,
            "jobs": len(alo) + len(amo),
            "lost": lost,
            "duplicated": duplicated,
            "rescued or re-run": rescued,
            "time_s": round(elapsed, 1),
        }

    def close(self) -> None:
        for inst in self.instances:
            inst.stop()
        with psycopg.connect(self.admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.dbname}" WITH (FORCE)')
        client = redis.Redis.from_url(self.redis_url)
        keys = list(client.scan_iter(match=self.prefix + "*"))
        if keys:
            client.delete(*keys)


def kill_pool(scale: float) -> dict[str, object]:
    """S1 chaos: a pool process kill -9 every 5 s, alternating pools, while 25k jobs drain."""
    s = Scenario("kill -9 pool every 5 s")
    try:
        s.instance("alo,amo")
        app = s.app(["alo", "amo"])
        rng = random.Random(1)
        n = int(20000 * scale)
        alo = app.enqueue_many("alo", [{"ms": rng.randint(5, 40)} for _ in range(n)])
        amo = app.enqueue_many("amo", [{"ms": 20}] * int(5000 * scale))
        kinds = ["alo", "amo"]
        k = 0
        while s.live() > 0:
            deadline = time.monotonic() + 5
            wait_until(
                lambda d=deadline: time.monotonic() > d or s.live() == 0,
                interval=0.2,
                what="next kill",
            )  # the fault's own period
            pids = pool_pids(s.url, kinds[k % 2])
            if pids and running_in_pid(s.ledger, pids[0]):
                s.kill(pids[0])
            k += 1
        return s.result(alo, amo)
    finally:
        s.close()


def kill_coordinator(scale: float) -> dict[str, object]:
    """S2 chaos: two instances; kill -9 the leader's coordinator 3 times, then SIGSTOP it."""
    s = Scenario("kill -9 / SIGSTOP leader")
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
            wait_until(
                lambda p=pid: (
                    not sql(
                        s.url,
                        "SELECT 1 FROM hivejobs_leader l JOIN "
                        "hivejobs_worker w ON w.id = l.holder "
                        "WHERE w.pid = %s",
                        (p,),
                    )
                ),
                timeout=20,
                what="new leader",
            )
        return s.result(alo, [])
    finally:
        s.close()


def redis_faults(scale: float) -> dict[str, object]:
    """S4 chaos: FLUSHALL at 25 %, SHUTDOWN NOSAVE + restart at 60 %, CLIENT KILL at 80 %."""
    server = RedisServer(Path(tempfile.mkdtemp(prefix="hjchaos-redis-")))
    s = Scenario("Redis flush, restart, client kill", server.url)
    try:
        s.instance("alo", HJ_CONCURRENCY_ALO="4")
        app = s.app(["alo"])
        n = int(20000 * scale)
        alo = app.enqueue_many("alo", [{"ms": 2}] * n)
        client = redis.Redis.from_url(server.url)
        wait_until(lambda: s.done() >= n * 0.25, timeout=120, what="25 %")
        client.flushall()
        wait_until(lambda: s.done() >= n * 0.6, timeout=120, what="60 %")
        try:
            client.shutdown(nosave=True)
        except redis.ConnectionError:
            pass
        alo += [app.enqueue("alo", {"ms": 1}) for _ in range(int(1000 * scale))]  # Redis down
        server.start()
        wait_until(lambda: s.done() >= n * 0.8, timeout=120, what="80 %")
        client = redis.Redis.from_url(server.url)
        client.client_kill_filter(_type="normal")
        return s.result(alo, [])
    finally:
        s.close()
        server.stop()


def redis_pause(scale: float) -> dict[str, object]:
    """S6 chaos: Redis SIGSTOPped for 10 s at 30 % and 20 s at 60 %."""
    server = RedisServer(Path(tempfile.mkdtemp(prefix="hjchaos-redis-")))
    s = Scenario("Redis SIGSTOP 10 s + 20 s", server.url)
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
        return s.result(alo, [])
    finally:
        s.close()
        server.stop()


def rolling_restarts(scale: float) -> dict[str, object]:
    """S3 chaos: A -> B -> A handovers by SIGTERM with long and short jobs in flight."""
    s = Scenario("rolling restart x3")
    types = "long_coop,long_stubborn,alo"
    try:
        current = s.instance(types)
        app = s.app(["long_coop", "long_stubborn", "alo"])
        alo = app.enqueue_many("alo", [{"ms": 10}] * int(20000 * scale))
        alo += app.enqueue_many("long_coop", [{"s": 8}] * 40)
        alo += app.enqueue_many("long_stubborn", [{"s": 8}] * 10)
        for _ in range(3):
            nxt = s.instance(types)
            wait_until(lambda: len(pool_pids(s.url, "alo")) == 2, what="next instance")
            current.signal_group(signal.SIGTERM)
            if current.wait(15) != 0:
                raise AssertionError("a supervisor exited non-zero on SIGTERM")
            current = nxt
        return s.result(alo, [])
    finally:
        s.close()


SCENARIOS: dict[str, Callable[[float], dict[str, object]]] = {
    "kill_pool": kill_pool,
    "kill_coordinator": kill_coordinator,
    "redis": redis_faults,
    "redis_pause": redis_pause,
    "rolling": rolling_restarts,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="multiply job counts")
    parser.add_argument("--only", default=",".join(SCENARIOS))
    args = parser.parse_args()
    rows = []
    for name in args.only.split(","):
        print(f"running {name} ...", file=sys.stderr)
        try:
            rows.append(SCENARIOS[name](args.scale))
        except Exception as exc:  # noqa: BLE001 - report and go on with the others
            rows.append(
                {
                    "scenario": name,
                    "jobs": "-",
                    "lost": "-",
                    "duplicated": "-",
                    "rescued or re-run": "-",
                    "time_s": f"ERROR {exc}",
                }
            )
        print(rows[-1], file=sys.stderr)
    header = list(rows[0])
    widths = [max(len(h), *(len(str(r[h])) for r in rows)) for h in header]
    for row in [dict(zip(header, header, strict=True)), *rows]:
        print("  ".join(str(row[h]).ljust(w) for h, w in zip(header, widths, strict=True)))
    return 1 if any(r["lost"] not in (0,) or r["duplicated"] not in (0,) for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
