"""Pressure cells: hivejobs' Postgres side under what production does to a hot job table.

    PYTHONPATH=src python3 bench/pressure.py [--minute-s 60] [--cells all] [--json PATH]

One real `hivejobs run` (2 pool processes x 8 threads, a 1 ms sleep as the job body) on a
throwaway Postgres cluster with autovacuum ON (bench/throwaway_postgres.sh: the shared server's
settings are never touched), the default Redis under a prefix of its own. It first measures
the clean drain rate R (a backlog drained with nothing else running), then keeps a producer
enqueueing at 0.7 R (1.5 R in the overload cell) while the cells run one after the other:

  clean      nothing else (1 minute)
  pinned     one session holds `BEGIN; SELECT txid_current()` (the xmin horizon is pinned,
             vacuum removes nothing) for 10 minutes, then releases it; 2 minutes after
  readers    4 REPEATABLE READ sessions scan the hot tables in turns (3 minutes)
  overload   the producer at 1.5 R (5 minutes), then at 0.7 R until the backlog is gone
             (at most 5 minutes)
  terminate  pg_terminate_backend of one of the worker's connections every 0.5 s (2 minutes)
  idle       300 idle connections held (max_connections 400: 100 left to everyone else)
             (2 minutes)

Every `--minute-s` seconds (a "minute"; smaller for a smoke run) one row: the cell, jobs
enqueued and completed per second, the backlog, pickup p50/p99 (enqueue to handler start,
of the jobs started in that minute), dead and live tuples and the sizes of hivejobs' tables
and indexes (the archive included), and the RSS of every worker process. At the end the
producer stops, the backlog drains, and `lost` counts acknowledged jobs that did not end
succeeded (must be 0). Not a unit test: the figures are the point; tests/process/
test_pressure.py runs it at a few seconds a minute and checks its invariants.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
import psycopg

from hivejobs.bench.environment import BenchEnvironment
from hivejobs.bench.percentiles import percentiles

ROOT = Path(__file__).resolve().parent.parent
REDIS = os.environ.get("HIVEJOBS_REDIS_URL", "redis://127.0.0.1:6379/0")
PG_BIN = Path("/usr/lib/postgresql/15/bin")
CELLS = ("clean", "pinned", "readers", "overload", "terminate", "idle")
# Minutes per phase of each cell: (phase name, minutes, producer rate as a share of R).
PLAN: dict[str, list[tuple[str, float, float]]] = {
    "clean": [("clean", 1, 0.7)],
    "pinned": [("pinned", 10, 0.7), ("pinned-released", 2, 0.7)],
    "readers": [("readers", 3, 0.7)],
    "overload": [("overload", 5, 1.5), ("overload-recovery", 5, 0.7)],
    "terminate": [("terminate", 2, 0.7)],
    "idle": [("idle", 2, 0.7)],
}
TABLES = ("hivejobs_job", "hivejobs_archive")
IDLE_CONNECTIONS = 300
READERS = 4


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def throwaway_cluster() -> Iterator[str]:
    """A Postgres 15 cluster of our own with autovacuum on; stopped and removed after."""
    folder = Path(tempfile.mkdtemp(prefix="hivejobs-pressure-"))
    port = free_port()
    script = ROOT / "bench" / "throwaway_postgres.sh"
    settings = ["-c", "autovacuum=on", "-c", f"max_connections={IDLE_CONNECTIONS + 100}"]
    try:
        out = subprocess.run(
            ["sh", str(script), str(port), str(folder), *settings],
            check=True,
            capture_output=True,
            text=True,
        )
        yield out.stdout.strip().splitlines()[-1]
    finally:
        as_pg = ["runuser", "-u", "postgres", "--"] if os.getuid() == 0 else []
        pg_ctl = [str(PG_BIN / "pg_ctl"), "-D", str(folder / "data"), "-m", "immediate", "stop"]
        subprocess.run([*as_pg, *pg_ctl], capture_output=True, check=False)
        shutil.rmtree(folder, ignore_errors=True)


class Producer(threading.Thread):
    """Enqueues `bench_noop` jobs at `rate` per second (changed between phases) in batches
    every 0.1 s; `acknowledged` counts the jobs whose enqueue returned. An enqueue that raised
    (a killed connection) acknowledged nothing: it is counted in `refused`, not as lost."""

    def __init__(self, env: BenchEnvironment) -> None:
        super().__init__(daemon=True)
        self.env = env
        self.rate = 0.0
        self.acknowledged = 0
        self.refused = 0
        self.stopped = threading.Event()

    def run(self) -> None:
        app = self.env.app
        assert app is not None
        owed = 0.0
        tick = time.monotonic()
        while not self.stopped.wait(max(0.0, tick + 0.1 - time.monotonic())):
            now = time.monotonic()
            # A producer that fell behind (enqueue slower than the rate) does not pay the debt
            # later: the next phase's rate must be its own. enqueued_per_s says what it did.
            owed = min(owed + self.rate * (now - tick), self.rate * 0.2)
            tick = now
            n = int(owed)
            if n == 0:
                continue
            owed -= n
            payloads = [{"t": time.time()} for _ in range(n)]
            try:
                app.enqueue_many("bench_noop", payloads)
                self.acknowledged += n
            except Exception:  # noqa: BLE001 - counted, the producer goes on
                self.refused += n


class Latencies:
    """Pickup latencies the bench app's handlers append (µs, one file per pool process):
    each `take()` returns the ones written since the last."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.offsets: dict[Path, int] = {}

    def take(self) -> list[int]:
        values: list[int] = []
        for path in self.folder.glob("latency.*"):
            with path.open("rb") as f:
                f.seek(self.offsets.get(path, 0))
                data = f.read()
            complete = data[: data.rfind(b"\n") + 1]
            self.offsets[path] = self.offsets.get(path, 0) + len(complete)
            values += [int(v) for v in complete.split()]
        return values


class Sampler:
    """One row per minute from the bench's own connection and /proc."""

    def __init__(self, env: BenchEnvironment, producer: Producer) -> None:
        self.env = env
        self.producer = producer
        self.latencies = Latencies(env.workdir)
        self.rows: list[dict[str, Any]] = []
        self._start = time.monotonic()
        self._last = (self._start, 0, env.archived())

    def sample(self, phase: str) -> dict[str, Any]:
        now, acked = time.monotonic(), self.producer.acknowledged
        done = self.env.archived()
        then, acked_before, done_before = self._last
        self._last = (now, acked, done)
        elapsed = now - then
        picked = self.latencies.take()
        p50, p99 = (p / 1000 for p in percentiles(picked, 50, 99)) if picked else (None, None)
        row: dict[str, Any] = {
            "phase": phase,
            "t_s": round(now - self._start, 1),
            "enqueued_per_s": round((acked - acked_before) / elapsed, 1),
            "completed_per_s": round((done - done_before) / elapsed, 1),
            "backlog": int(self.env.sql("SELECT count(*) FROM hivejobs_job")[0][0]),
            "pickup_p50_ms": p50,
            "pickup_p99_ms": p99,
            "tables": self.tables(),
            "worker_rss_mb": self.worker_rss_mb(),
        }
        self.rows.append(row)
        print(json.dumps(row), flush=True)
        return row

    def tables(self) -> dict[str, dict[str, int]]:
        rows = self.env.sql(
            "SELECT relname, n_dead_tup, n_live_tup, pg_table_size(relid),"
            " pg_indexes_size(relid) FROM pg_stat_user_tables WHERE relname = ANY(%s)",
            (list(TABLES),),
        )
        return {
            r[0]: {"dead": r[1], "live": r[2], "table_kb": r[3] // 1024, "index_kb": r[4] // 1024}
            for r in rows
        }

    def worker_rss_mb(self) -> dict[str, float]:
        worker = self.env.worker
        if worker is None:
            return {}
        found: dict[str, float] = {}
        try:
            top = psutil.Process(worker.pid)
            for proc in [top, *top.children(recursive=True)]:
                found[f"{proc.pid} {proc.name()}"] = round(proc.memory_info().rss / 2**20, 1)
        except psutil.Error:
            pass  # a process ending between the listing and its read
        return found


class Pressure:
    """What a cell does beside the producer: started at the cell's first phase, stopped at
    its end. Each holds its own connections to the cluster."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.stopped = threading.Event()
        self.threads: list[threading.Thread] = []
        self.conns: list[psycopg.Connection[Any]] = []
        self.terminated = 0

    def start(self, cell: str) -> None:
        self.stopped.clear()
        starters: dict[str, Callable[[], None]] = {
            "pinned": self._pin_xmin,
            "readers": self._readers,
            "terminate": lambda: self._thread(self._terminate),
            "idle": self._idle,
        }
        if cell in starters:
            starters[cell]()

    def stop(self) -> None:
        self.stopped.set()
        for thread in self.threads:
            thread.join(30)
        for conn in self.conns:
            conn.close()
        self.threads, self.conns = [], []

    def _thread(self, target: Callable[[], None]) -> None:
        thread = threading.Thread(target=target, daemon=True)
        self.threads.append(thread)
        thread.start()

    def _pin_xmin(self) -> None:
        conn = psycopg.connect(self.url)  # a transaction stays open until stop() closes it
        conn.execute("SELECT txid_current()")
        self.conns.append(conn)

    def _readers(self) -> None:
        for _ in range(READERS):
            self._thread(self._read_in_turns)

    def _read_in_turns(self) -> None:
        with psycopg.connect(self.url) as conn:
            conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            while not self.stopped.is_set():
                with conn.transaction():
                    for table in TABLES:
                        conn.execute(f"SELECT count(*), max(id) FROM {table}")  # noqa: S608
                self.stopped.wait(0.2)

    def _terminate(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self.stopped.wait(0.5):
                row = conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND application_name LIKE 'hivejobs %'"
                    " AND pid <> pg_backend_pid() ORDER BY random() LIMIT 1"
                ).fetchone()
                self.terminated += 1 if row and row[0] else 0

    def _idle(self) -> None:
        for _ in range(IDLE_CONNECTIONS):
            self.conns.append(psycopg.connect(self.url, autocommit=True))


def clean_rate(env: BenchEnvironment, jobs: int) -> float:
    """Jobs per second draining a backlog of `jobs` with nothing else running."""
    assert env.app is not None
    before = env.archived()
    began = time.monotonic()
    env.app.enqueue_many("bench_noop", [{} for _ in range(jobs)])
    while env.archived() - before < jobs:
        time.sleep(0.05)
    return jobs / (time.monotonic() - began)


def run(minute_s: float, cells: list[str], backlog_jobs: int) -> dict[str, Any]:
    with throwaway_cluster() as server, BenchEnvironment(server, REDIS) as env:
        env.start_worker(processes=2, concurrency=8, work_ms=1, work="sleep")
        rate = clean_rate(env, backlog_jobs)
        print(json.dumps({"clean_rate_per_s": round(rate, 1)}), flush=True)
        producer = Producer(env)
        sampler = Sampler(env, producer)
        pressure = Pressure(env.database_url)
        producer.start()
        for cell in cells:
            pressure.start(cell)
            for phase, minutes, share in PLAN[cell]:
                if phase.endswith(("-released", "-recovery")):
                    pressure.stop()
                producer.rate = rate * share
                for _ in range(max(1, round(minutes))):
                    time.sleep(minute_s)  # the sampling period: the measurement's own clock
                    row = sampler.sample(phase)
                    if phase == "overload-recovery" and row["backlog"] == 0:
                        break
            pressure.stop()
        producer.stopped.set()
        producer.join()
        deadline = time.monotonic() + 600
        while env.sql("SELECT count(*) FROM hivejobs_job")[0][0] and time.monotonic() < deadline:
            time.sleep(0.2)
        succeeded = int(
            env.sql("SELECT count(*) FROM hivejobs_archive WHERE state = 'succeeded'")[0][0]
        )
        expected = backlog_jobs + producer.acknowledged
        return {
            "machine": f"{os.cpu_count()} cores",
            "body": "bench_noop, time.sleep(1 ms), 2 processes x 8 threads",
            "postgres": "15, throwaway cluster, autovacuum on, fsync on, shared_buffers 128MB,"
            f" max_connections {IDLE_CONNECTIONS + 100}",
            "minute_s": minute_s,
            "clean_rate_per_s": round(rate, 1),
            "acknowledged": expected,
            "refused_enqueues": producer.refused,
            "backends_terminated": pressure.terminated,
            "left_unfinished": int(env.sql("SELECT count(*) FROM hivejobs_job")[0][0]),
            "lost": max(0, expected - succeeded),
            # An enqueue that raised may still have committed: its jobs run, unacknowledged.
            "ran_unacknowledged": max(0, succeeded - expected),
            "rows": sampler.rows,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minute-s", type=float, default=60.0, help="a sampling period")
    parser.add_argument("--cells", default="all", help=f"comma list of {','.join(CELLS)}")
    parser.add_argument("--backlog-jobs", type=int, default=20000, help="for the clean rate")
    parser.add_argument("--json", type=Path, help="write the result there")
    args = parser.parse_args()
    cells = list(CELLS) if args.cells == "all" else args.cells.split(",")
    unknown = sorted(set(cells) - set(CELLS))
    if unknown:
        parser.error(f"unknown cells {unknown}: choose from {','.join(CELLS)}")
    result = run(args.minute_s, cells, args.backlog_jobs)
    text = json.dumps(result, indent=1)
    if args.json:
        args.json.write_text(text + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}))
    raise SystemExit(1 if result["lost"] else 0)


if __name__ == "__main__":
    main()
