"""`hivejobs bench --scenarios progress` at CI size: both drains run and are reported side
by side (never its timings: speed lives in bench/results/)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.harness import REDIS_URL, ROOT, sql
from tests.process.test_bench import bench_run_id


def test_progress_scenario_reports_with_and_without_side_by_side(
    admin_url: str, tmp_path: Path
) -> None:
    out = tmp_path / "bench.json"
    server = admin_url.rsplit("/", 1)[0] + "/postgres"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "hivejobs",
            "bench",
            "--scenarios",
            "progress",
            "--jobs",
            "200",
            "--repeats",
            "1",
            "--sweep",
            "0,1",
            "--database-url",
            server,
            "--redis-url",
            REDIS_URL,
            "--json",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr
    figures = json.loads(out.read_text())["medians"]["progress"]
    for ms in ("0ms", "1ms"):
        assert figures[f"{ms}_without_progress_jobs_per_s"] > 0
        assert figures[f"{ms}_with_progress_jobs_per_s"] > 0
        # Every job that reported left exactly its last report.
        assert figures[f"{ms}_progress_rows_per_job"] == 1.0
    assert "0ms with vs without" in proc.stdout  # the table
    run_id = bench_run_id(proc.stderr)
    assert sql(admin_url, "SELECT 1 FROM pg_database WHERE datname = %s", (run_id.db,)) == []
