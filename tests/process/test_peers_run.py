"""bench/peers/run.py stopped by SIGTERM (a cancelled CI job, `timeout`) ends as Ctrl-C does:
the running driver's workers stop, its database is dropped and its Redis db emptied. Killed
outright it left the driver draining in a session of its own, and its database behind."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import redis

from tests.harness import ROOT, RedisServer, alive, sql, wait_until, worker_processes


def test_a_peers_run_stopped_by_sigterm_stops_its_workers_and_drops_its_database(
    admin_url: str, own_redis: RedisServer, tmp_path: Path
) -> None:
    err = tmp_path / "stderr"
    proc = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "bench" / "peers" / "run.py"),
            *("--systems", "hivejobs", "--jobs", "200000", "--repeats", "1"),
            *("--redis-url", own_redis.url, "--pg-url", admin_url),
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=err.open("wb"),
    )
    mine = f"peers_hivejobs_{proc.pid}_%"

    def databases() -> list[str]:
        rows = sql(admin_url, "SELECT datname FROM pg_database WHERE datname LIKE %s", (mine,))
        return [r[0] for r in rows]

    def workers() -> set[int] | None:
        found = databases()
        url = admin_url.rsplit("/", 1)[0] + "/" + found[0] if found else ""
        pids = worker_processes(url) if url else set()
        return pids if len(pids) >= 4 else None  # supervisor, 2 pools, coordinator

    try:
        worker = wait_until(workers, timeout=90, what="the hivejobs driver's worker")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(90) != 0, err.read_text()[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    wait_until(lambda: not {p for p in worker if alive(p)}, timeout=10, what="workers gone")
    assert databases() == []
    assert redis.Redis.from_url(own_redis.url).info("keyspace") == {}  # its db emptied
