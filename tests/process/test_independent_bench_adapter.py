"""The hivejobs adapter of the independent Postgres job-queue benchmark speaks its contract.

bench/independent/hivejobs-bench/main.py runs for a few seconds against a fresh, empty
database (it migrates it), with its real `hivejobs run` worker: its JSONL must hold the
descriptor and, every tick, each metric the contract requires with sane values; SIGTERM must
end it with 0 within the contract's 5 s, its worker with it; and a SIGKILL of the adapter
(the harness's kill-worker phase) must take the worker down too, as a crash of the machine
would, instead of leaving it running unseen.
"""

from __future__ import annotations

import json
import math
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import psycopg
import pytest

from tests.harness import REDIS_URL, ROOT, wait_until

ADAPTER = ROOT / "bench" / "independent" / "hivejobs-bench"
REQUIRED = (
    "claim_p50_ms",
    "claim_p95_ms",
    "claim_p99_ms",
    "enqueue_rate",
    "completion_rate",
    "queue_depth",
)
WINDOWS = {
    "claim_p50_ms": 30.0,
    "claim_p95_ms": 30.0,
    "claim_p99_ms": 30.0,
    "enqueue_rate": 1.0,
    "completion_rate": 1.0,
    "queue_depth": 0.0,
}
RATE = 100


@pytest.fixture
def empty_database(admin_url: str) -> Iterator[str]:
    """A database with no hivejobs tables: the adapter must migrate it itself."""
    name = f"hjtest_indep_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield name
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


class Adapter:
    """The adapter process and the JSONL records it printed (a reader thread appends)."""

    def __init__(self, admin_url: str, db: str, prefix: str, log: Path) -> None:
        env = dict(
            os.environ,
            DATABASE_URL=admin_url.rsplit("/", 1)[0] + "/" + db,
            REDIS_URL=REDIS_URL,
            REDIS_PREFIX=prefix,
            SCENARIO="long_horizon",
            PRODUCER_MODE="fixed",
            PRODUCER_RATE=str(RATE),
            SAMPLE_EVERY_S="1",
            WORKER_COUNT="4",
            JOB_WORK_MS="1",
        )
        env.pop("PRODUCER_PACING", None)
        self.log = log.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, str(ADAPTER / "main.py")],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self.log,
        )
        self.records: list[dict[str, Any]] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.records.append(json.loads(line))  # stdout holds JSONL only

    def samples(self, metric: str) -> list[dict[str, Any]]:
        return [r for r in self.records if r.get("kind") == "adapter" and r["metric"] == metric]

    def worker_processes(self) -> list[psutil.Process]:
        children: list[psutil.Process] = psutil.Process(self.proc.pid).children(recursive=True)
        return children

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def gone(procs: list[psutil.Process]) -> bool:
    for p in procs:
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            continue
    return True


def ran_jobs(adapter: Adapter) -> bool:
    done = [s for s in adapter.samples("completion_rate") if s["value"] > 0]
    return bool(done) and any(s["value"] > 0 for s in adapter.samples("claim_p50_ms"))


def wait_running(adapter: Adapter, log: Path, what: str) -> None:
    """Until its samples show jobs picked up and completed; it must still be running."""
    wait_until(lambda: ran_jobs(adapter) or adapter.proc.poll() is not None, timeout=180, what=what)
    assert adapter.proc.poll() is None, log.read_text()[-3000:]


def test_adapter_emits_the_contract_and_stops_on_sigterm(
    admin_url: str, empty_database: str, redis_prefix: str, tmp_path: Path
) -> None:
    adapter = Adapter(admin_url, empty_database, redis_prefix, tmp_path / "adapter.log")
    try:
        wait_running(
            adapter, tmp_path / "adapter.log", "samples showing jobs picked up and completed"
        )
        # A few more ticks at the steady rate before the stop.
        ticks = len(adapter.samples("enqueue_rate"))
        wait_until(
            lambda: len(adapter.samples("enqueue_rate")) >= ticks + 3,
            timeout=60,
            what="three more ticks",
        )
        workers = adapter.worker_processes()
        assert any("hivejobs" in " ".join(p.cmdline()) for p in workers)
        sent = time.monotonic()
        adapter.proc.send_signal(signal.SIGTERM)
        rc = adapter.proc.wait(timeout=30)
        stopped_in = time.monotonic() - sent
        adapter.reader.join(timeout=10)
    finally:
        adapter.close()
    assert rc == 0, (tmp_path / "adapter.log").read_text()[-3000:]
    assert stopped_in < 5.0
    wait_until(lambda: gone(workers), timeout=10, what="the worker processes gone")

    descriptor = adapter.records[0]
    manifest = json.loads((ADAPTER / "adapter.json").read_text())
    assert descriptor["kind"] == "descriptor"
    assert descriptor["system"] == manifest["system"] == "hivejobs"
    assert set(descriptor["event_tables"]) >= set(manifest["event_tables"])
    assert set(descriptor["extensions"]) >= set(manifest["extensions"])
    assert descriptor["db_name"] == empty_database
    assert descriptor["version"] and descriptor["schema_version"].isdigit()
    assert descriptor["started_at"].endswith("Z")

    for metric in REQUIRED:
        samples = adapter.samples(metric)
        assert len(samples) >= 4, metric
        for s in samples:
            assert s["system"] == "hivejobs" and s["subject_kind"] == "adapter"
            assert s["subject"] == "" and s["window_s"] == WINDOWS[metric]
            assert math.isfinite(s["value"]) and s["value"] >= 0, s
    times = [s["t"] for s in adapter.samples("queue_depth")]
    assert times == sorted(times) and len(set(times)) == len(times)  # one record per tick
    for p50, p95, p99 in zip(*(adapter.samples(m) for m in REQUIRED[:3]), strict=True):
        assert p50["t"] == p95["t"] == p99["t"]
        assert p50["value"] <= p95["value"] <= p99["value"]
    # Paced on real elapsed time: the offered rate holds (the first tick is partial).
    rates = [s["value"] for s in adapter.samples("enqueue_rate")[1:]]
    assert RATE * 0.5 <= statistics.median(rates) <= RATE * 1.5, rates
    assert sum(s["value"] for s in adapter.samples("completion_rate")) > 0


def test_a_killed_adapter_takes_its_worker_down(
    admin_url: str, empty_database: str, redis_prefix: str, tmp_path: Path
) -> None:
    adapter = Adapter(admin_url, empty_database, redis_prefix, tmp_path / "adapter.log")
    try:
        wait_running(adapter, tmp_path / "adapter.log", "jobs running")
        workers = adapter.worker_processes()
        assert workers
        adapter.proc.kill()
        adapter.proc.wait(timeout=30)
    finally:
        adapter.close()
    wait_until(lambda: gone(workers), timeout=30, what="the worker processes gone")
