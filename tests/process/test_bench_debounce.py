"""The CI-size run of `hivejobs bench --scenarios debounce` (the full run's figures are in
bench/results/2026-12-06-debounce.txt): it reports every figure, leaves one job per key even
from 16 threads, and leaves nothing behind."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import redis

from hivejobs.bench.debounce import ROUNDS
from tests.harness import REDIS_URL, ROOT, sql
from tests.process.test_bench import bench_run_id

JOBS = 100


def test_debounce_scenario_reports_its_cost(admin_url: str, tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    server = admin_url.rsplit("/", 1)[0] + "/postgres"
    args = ["--scenarios", "debounce", "--jobs", str(JOBS), "--repeats", "1", "--json", str(out)]
    proc = subprocess.run(
        [sys.executable, "-m", "hivejobs", "bench", *args, "--database-url", server],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    figures = json.loads(out.read_text())["medians"]["debounce"]
    rates = ["plain", "debounce", "debounce_new_key", "coalesce"]
    assert all(figures[f"{v}_per_s"] > 0 for v in rates)
    assert all(figures[f"{v}_vs_plain"] > 0 for v in rates[1:])
    assert figures["debounce_16_threads_per_s"] > 0
    # One job for the debounced key (enqueued alone and from 16 threads), one per new key
    # (the warm-up's and one per timed enqueue).
    assert figures["debounce_jobs_left"] == 1 + 1 + JOBS // ROUNDS * ROUNDS
    run_id = bench_run_id(proc.stderr)
    assert sql(admin_url, "SELECT 1 FROM pg_database WHERE datname = %s", (run_id.db,)) == []
    client = redis.Redis.from_url(REDIS_URL)
    assert list(client.scan_iter(match=run_id.prefix + "*")) == []
    client.close()
