"""bench/peers/run.py stopped by SIGTERM (a cancelled CI job, `timeout`) ends as Ctrl-C does:
the running driver's workers stop, its database is dropped and its Redis db emptied. Killed
outright it left the driver draining in a session of its own, and its database behind."""

from __future__ import annotations

import json
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


def test_a_peers_run_gives_hivejobs_a_def_and_an_async_def_row_each_naming_its_body(
    admin_url: str, own_redis: RedisServer, tmp_path: Path
) -> None:
    """By default hivejobs runs twice per round, a `def` handler (blocking body) and an
    `async def` one (asyncio body); each row names its body, and its jobs report that they
    ran that body (an async handler that ran the blocking body would fail its row)."""
    out = tmp_path / "peers.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "peers" / "run.py"),
            *("--systems", "hivejobs", "--jobs", "300", "--repeats", "1"),
            *("--work", "redis", "--work-ms", "0.1", "--json", str(out)),
            *("--redis-url", own_redis.url, "--pg-url", admin_url),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = json.loads(out.read_text())["tables"]["redis 0.1 ms"]
    assert table["failures"] == {}, table["failures"]
    medians = table["medians"]
    assert set(medians) == {"hivejobs/sync", "hivejobs/async"}
    assert medians["hivejobs/sync"]["body"] == "sync"
    assert medians["hivejobs/sync"]["settings"].startswith("`def` handler")
    assert medians["hivejobs/async"]["body"] == "async"
    assert medians["hivejobs/async"]["settings"].startswith("`async def` handler")
    for key, (run,) in table["runs"].items():
        body = key.rpartition("/")[2]
        assert run["body"] == body and run["ran"] == {body: run["completions"]}, run
        assert run["completions"] == 300 + 200  # the drain and the latency jobs, once each
    assert "hivejobs async def / this" in proc.stdout  # a ratio column per hivejobs row
