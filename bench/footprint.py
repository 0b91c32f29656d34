"""Footprint of one `hivejobs run` instance with many job types, with and without `pool=`.

    PYTHONPATH=src:. python3 bench/footprint.py [--types 30] [--jobs 20] [--rounds 1]

Runs tests/apps/poolapp.py with HJ_MANY types (each concurrency 2, a 5 ms sleep as its body),
once with every type on pool "small" and once with a process per type, each against a fresh
database. Reports the reported bound, the processes, their summed RSS and PSS (forked
processes share pages: PSS splits them) idle and after a run of `--jobs` jobs per type, and
the Postgres connections of the instance (pg_stat_activity of its database: peak while the
jobs ran, and once idle), and how long the jobs took from the first enqueue (`drain_ms`,
sampled every ~50 ms: a rough figure). Not a speed benchmark: it measures what an instance
holds.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
ADMIN = os.environ.get("HIVEJOBS_BENCH_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS = os.environ.get("HIVEJOBS_REDIS_URL", "redis://127.0.0.1:6379/0")


def tree(pid: int) -> list[int]:
    """`pid` and its descendants."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parents[int(stat.parent.name)] = int(stat.read_text().split(") ", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo += [c for c, pp in parents.items() if pp == p]
    return found


def memory_mb(pids: list[int]) -> tuple[float, float]:
    """Summed RSS and PSS in MiB (smaps_rollup)."""
    rss = pss = 0
    for pid in pids:
        try:
            text = Path(f"/proc/{pid}/smaps_rollup").read_text()
        except OSError:
            continue
        rss += int(re.search(r"^Rss:\s+(\d+)", text, re.M).group(1))  # type: ignore[union-attr]
        pss += int(re.search(r"^Pss:\s+(\d+)", text, re.M).group(1))  # type: ignore[union-attr]
    return rss / 1024, pss / 1024


def connections(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid()"
        ).fetchone()
    return int(row[0]) if row else 0


def wait(predicate: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.1)


def one_run(types: int, jobs: int, pool: str) -> dict[str, object]:
    name = f"hj_footprint_{uuid.uuid4().hex[:8]}"
    url = psycopg.conninfo.make_conninfo(ADMIN, dbname=name)
    prefix = f"{name}:"
    ledger = tempfile.mkdtemp(prefix="hj-footprint-")
    env = {
        **os.environ,
        "HIVEJOBS_DATABASE_URL": url,
        "HIVEJOBS_REDIS_URL": REDIS,
        "HIVEJOBS_PREFIX": prefix,
        "HJ_MANY": str(types),
        "HJ_MANY_POOL": pool,
        "HJ_LEDGER": ledger,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
    }
    subprocess.run([sys.executable, "-m", "hivejobs", "migrate"], env=env, check=True)
    log = Path(ledger) / "run.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "hivejobs", "run", "tests.apps.poolapp:app"],
            env=env,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        with psycopg.connect(url, autocommit=True) as conn:

            def registered() -> bool:
                row = conn.execute("SELECT count(*) FROM hivejobs_worker WHERE role = 'pool'")
                return int(row.fetchone()[0]) == types  # type: ignore[index]

            wait(registered, 120, "every type's worker row")
        found = re.search(r"at most (\d+) Postgres connections", log.read_text())
        bound = int(found.group(1)) if found else -1
        time.sleep(3.0)  # settle: connections opened at start, first heartbeats
        pids = tree(proc.pid)
        idle_rss, idle_pss = memory_mb(pids)
        idle_conns = connections(url)
        sys.path.insert(0, str(ROOT / "src"))
        from hivejobs import App

        app = App(database_url=url, redis_url=REDIS, prefix=prefix)
        app.types.clear()
        started = time.monotonic()
        for i in range(types):
            app.enqueue_many(f"m{i}", [{"ms": 5}] * jobs)
        peak = 0
        with psycopg.connect(url, autocommit=True) as conn:
            while True:
                left = conn.execute("SELECT count(*) FROM hivejobs_job").fetchone()
                peak = max(peak, connections(url) - 1)  # minus the App's own (1)
                if left is not None and left[0] == 0:
                    drain_s = time.monotonic() - started
                    break
                time.sleep(0.05)
        busy_rss, busy_pss = memory_mb(tree(proc.pid))
        app.close()
        return {
            "pool": pool or None,
            "types": types,
            "processes": len(pids),
            "reported_connections_max": bound,
            "connections_idle": idle_conns,
            "connections_peak": peak,
            "rss_mb_idle": round(idle_rss),
            "pss_mb_idle": round(idle_pss),
            "rss_mb_after": round(busy_rss),
            "pss_mb_after": round(busy_pss),
            "drain_ms": round(drain_s * 1000),  # enqueue to the last job's end, sampled
        }
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)
        with psycopg.connect(ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--types", type=int, default=30)
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    results: dict[str, list[dict[str, object]]] = {"small": [], "": []}
    for _ in range(args.rounds):
        for pool in ("small", ""):  # in turns: the machine's load falls on both alike
            results[pool].append(one_run(args.types, args.jobs, pool))
            print(json.dumps(results[pool][-1]), flush=True)
    for pool, runs in results.items():
        keys = [k for k, v in runs[0].items() if isinstance(v, int) and k != "types"]
        medians = {k: statistics.median(int(r[k]) for r in runs) for k in keys}  # type: ignore[call-overload]
        print(f"median pool={pool or None}: {json.dumps(medians)}")


if __name__ == "__main__":
    main()
