"""`hivejobs bench`: options, isolation, cleanup and the JSON it writes (never its timings)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import redis

from hivejobs.bench.cost import DrainCost
from hivejobs.bench.environment import BenchEnvironment
from hivejobs.cli import main
from hivejobs.worker.fetcher import PREFETCH, UNWRITTEN_PER_RUNNER
from tests.harness import REDIS_URL, ROOT, alive, sql, wait_until, worker_processes


class BenchRun(NamedTuple):
    db: str
    prefix: str


def bench_run_id(stderr: str) -> BenchRun:
    """The sandbox this bench run made, from its first line ("hivejobs bench on Postgres at ...
    (database hivejobs_bench_<id>), ..."): its database and Redis prefix share <id>."""
    found = re.search(r"\bhivejobs_bench_([0-9a-f]{8})\b", stderr)
    assert found, stderr
    return BenchRun(f"hivejobs_bench_{found[1]}", f"hivejobs-bench:{found[1]}:")


class BenchResult(NamedTuple):
    proc: subprocess.CompletedProcess[str]
    report: dict[str, Any]  # the --json file

    def medians(self, scenario: str) -> dict[str, float]:
        figures: dict[str, float] = self.report["medians"][scenario]
        return figures


def run_bench(admin_url: str, tmp_path: Path, *args: str) -> BenchResult:
    """`hivejobs bench ARGS --json` in a subprocess against this run's servers, as a user runs
    it; fails with its stderr unless it exits 0. The database URL names the server only (the
    bench makes and drops a database of its own)."""
    out = tmp_path / "bench.json"
    server = admin_url.rsplit("/", 1)[0] + "/postgres"
    command = [sys.executable, "-m", "hivejobs", "bench", *args]
    command += ["--database-url", server, "--redis-url", REDIS_URL, "--json", str(out)]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    return BenchResult(proc, json.loads(out.read_text()))


def assert_left_nothing(admin_url: str, result: BenchResult) -> None:
    """The run dropped its database and deleted its Redis keys (judged by its own id: other
    benches may share these servers)."""
    run_id = bench_run_id(result.proc.stderr)
    assert sql(admin_url, "SELECT 1 FROM pg_database WHERE datname = %s", (run_id.db,)) == []
    client = redis.Redis.from_url(REDIS_URL)
    try:
        assert list(client.scan_iter(match=run_id.prefix + "*")) == []
    finally:
        client.close()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--scenarios", "throughput,warp"], "unknown scenario ['warp']"),
        (["--jobs", "0"], "--jobs must be at least 1"),
        (["--rate", "-5"], "--rate and --duration must be positive"),
        (["--work-ms", "-1"], "--work-ms and --payload-bytes cannot be negative"),
        (["--repeats", "x"], "invalid int value"),
        (["--work", "gpu"], "unknown --work 'gpu': choose from sleep, cpu, redis"),
        (["--sweep", "0,x"], "--sweep takes milliseconds like 0,0.1,1,10, not '0,x'"),
        (["--sweep", "1,-1"], "--sweep needs one or more durations, none negative"),
    ],
)
def test_bad_options_exit_2_with_one_line(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_small_bench_writes_json_and_leaves_nothing_behind(admin_url: str, tmp_path: Path) -> None:
    client = redis.Redis.from_url(REDIS_URL)
    user_key = f"user:data:{uuid.uuid4().hex[:8]}"
    client.set(user_key, "kept")  # a user's key next to the bench's prefix
    args = ["--scenarios", "enqueue,throughput,latency,prune", "--backlog-jobs", "3000"]
    args += ["--jobs", "300", "--repeats", "2", "--rate", "200", "--duration", "0.5"]
    result = run_bench(admin_url, tmp_path, *args, "--plot", str(tmp_path / "bench.png"))
    proc = result.proc
    assert "throughput: steady drain rate, jobs per s" in proc.stdout  # the summary table

    report = result.report
    assert set(report) >= {"options", "runs", "medians", "versions", "wall_s"}
    assert set(report["versions"]) >= {"python", "postgres", "redis", "cpus"}
    assert len(report["runs"]["throughput"]) == 2  # --repeats
    assert set(report["medians"]["ceilings"]) == {
        "redis_round_trips_per_s",
        "pg_commits_per_s",
        "pg_batched_lifecycle_jobs_per_s",
    }
    assert set(report["medians"]["enqueue"]) == {
        "enqueue_single_per_s",
        "enqueue_async_single_per_s",
        "raw_commits_alongside_per_s",
        "enqueue_single_vs_raw",
        "enqueue_async_vs_sync",
        "enqueue_bulk_per_s",
    }
    assert {"pickup_p50_ms", "pickup_p99_ms"} <= set(report["medians"]["latency"])
    assert report["medians"]["throughput"]["throughput_jobs_per_s"] > 0
    assert report["medians"]["prune"]["prune_rows"] >= 2_998  # 3 days of 999 rows
    assert report["medians"]["prune"]["prune_rows_per_s"] > 0
    if importlib.util.find_spec("matplotlib") is None:  # hivejobs[plot] not installed
        assert "--plot needs matplotlib: pip install 'hivejobs[plot]'" in proc.stderr
    else:
        assert (tmp_path / "bench.png").read_bytes().startswith(b"\x89PNG")

    # Only its own database and prefix are judged: other benches may share this server.
    assert_left_nothing(admin_url, result)
    assert client.get(user_key) == b"kept"
    client.delete(user_key)


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_bench_stopped_mid_drain_stops_its_worker_and_leaves_nothing(
    admin_url: str, tmp_path: Path, stop: signal.Signals
) -> None:
    """SIGTERM (a cancelled CI job, `timeout`) and Ctrl-C end a bench through its cleanup,
    also when a script started it in the background (`trap '' INT` here: SIGINT inherited
    ignored, as for `cmd &`). Killed outright it left its worker draining, and its database,
    Redis keys and temp dir behind."""
    server = admin_url.rsplit("/", 1)[0] + "/postgres"
    (tmp_path / "tmp").mkdir()
    err = tmp_path / "stderr"
    bench = [sys.executable, "-m", "hivejobs", "bench", "--scenarios", "throughput"]
    bench += ["--jobs", "200000", "--repeats", "1", "--work-ms", "1"]
    bench += ["--database-url", server, "--redis-url", REDIS_URL]
    proc = subprocess.Popen(
        ["sh", "-c", 'trap "" INT; exec "$@"', "sh", *bench],
        cwd=ROOT,
        env=dict(os.environ, TMPDIR=str(tmp_path / "tmp")),
        stdout=subprocess.DEVNULL,
        stderr=err.open("wb"),
    )
    try:
        run_id = wait_until(
            lambda: "hivejobs_bench_" in err.read_text() and bench_run_id(err.read_text()),
            what="the bench's sandbox",
        )
        database = admin_url.rsplit("/", 1)[0] + "/" + run_id.db
        worker = wait_until(
            lambda: pids if len(pids := worker_processes(database)) >= 5 else None,
            timeout=60,
            what="the bench's worker: supervisor, 3 pools, coordinator",
        )
        proc.send_signal(stop)
        assert proc.wait(60) == 130, err.read_text()[-2000:]
    finally:
        if proc.poll() is None:  # the test failed first: its cleanup, as asked above
            proc.terminate()
            proc.wait(60)
    assert {p for p in worker if alive(p)} == set()
    assert sql(admin_url, "SELECT 1 FROM pg_database WHERE datname = %s", (run_id.db,)) == []
    assert list(redis.Redis.from_url(REDIS_URL).scan_iter(match=run_id.prefix + "*")) == []
    assert list((tmp_path / "tmp").iterdir()) == []


def test_bench_queries_share_one_session_closed_at_cleanup(admin_url: str) -> None:
    """BenchEnvironment.sql() keeps one session (progress polls start no backend each), the
    drain cost still leaves its statements out exactly (that session reports its counts when
    told), and cleanup closes it: with --keep the database stays, so the close is seen."""
    server = admin_url.rsplit("/", 1)[0] + "/postgres"
    with BenchEnvironment(server, REDIS_URL, keep=True) as env:
        pid = env.sql("SELECT pg_backend_pid()")[0][0]
        cost = DrainCost(env)
        for _ in range(20):  # what progress polling does during a drain
            assert env.sql("SELECT pg_backend_pid()")[0][0] == pid
        assert cost.figures(jobs=1)["pg_xacts_per_job"] == 0  # nothing ran but the bench
    try:
        activity = "SELECT 1 FROM pg_stat_activity WHERE pid = %s"
        wait_until(lambda: sql(admin_url, activity, (pid,)) == [], what="the session to end")
    finally:
        sql(admin_url, f'DROP DATABASE IF EXISTS "{env.dbname}" WITH (FORCE)')
        shutil.rmtree(env.workdir, ignore_errors=True)
        env.clear_redis(keep_boot_marker=False)


def test_stale_stats_scenario_drains_under_four_planner_states(
    admin_url: str, tmp_path: Path
) -> None:
    result = run_bench(
        admin_url, tmp_path, "--scenarios", "stale-stats", "--stale-stats-jobs", "300"
    )
    figures = result.medians("stale-stats")
    assert len(result.report["runs"]["stale-stats"]) == 1  # one run, not --repeats
    for state in ("none", "empty", "full", "quiet"):
        assert figures[f"stale_stats_{state}_per_s"] > 0
        assert figures[f"stale_stats_{state}_buffers_per_job"] > 0
        # Never more running rows than the pools' backpressure allows (2 processes x 8).
        bound = 2 * (UNWRITTEN_PER_RUNNER * 8 + PREFETCH)
        assert figures[f"stale_stats_{state}_most_running"] <= bound
    assert 0 < figures["stale_stats_slowest_vs_fastest"] <= 1
    assert figures["stale_stats_autovacuum_on"] in (0.0, 1.0)


def test_sweep_prints_one_row_per_duration_with_its_postgres_cost(
    admin_url: str, tmp_path: Path
) -> None:
    """`--work redis --sweep`: one throughput run per duration, each with the per-job cost
    read from the server; the rows come out in the printed table."""
    args = ["--scenarios", "throughput", "--jobs", "300", "--repeats", "1", "--work", "redis"]
    result = run_bench(admin_url, tmp_path, *args, "--sweep", "0,0.5")
    proc = result.proc
    medians = result.report["medians"]
    for row in ("redis 0 ms", "redis 0.5 ms"):
        figures = medians[f"throughput {row}"]
        assert figures["throughput_jobs_per_s"] > 0
        assert 1 <= figures["claim_batch"] <= 300 and 1 <= figures["completion_batch"] <= 300
        # During the drain each job is claimed (updated), deleted from the live table, archived.
        assert figures["pg_rows_written_per_job"] >= 3
        assert figures["pg_xacts_per_job"] > 0
        # Postgres runs here: its CPU is read (in 10 ms ticks: a short drain may read none),
        # and split by the roles the connections' application_name names.
        if "pg_cpu_ms_per_job" in figures:
            pools = figures["pg_cpu_ms_per_job_pools"]
            coordinator = figures["pg_cpu_ms_per_job_coordinator"]
            assert pools >= 0 and coordinator >= 0
            assert pools + coordinator <= figures["pg_cpu_ms_per_job"] + 1e-9
        assert row in proc.stdout


def test_otel_scenario_prices_three_modes_side_by_side(admin_url: str, tmp_path: Path) -> None:
    """CI size of `--scenarios otel` (bench/otel.py): each mode enqueues and drains, and the
    exporting mode's spans reach the bench's OTLP sink (the scenario fails otherwise)."""
    result = run_bench(admin_url, tmp_path, "--scenarios", "otel", "--jobs", "50", "--repeats", "1")
    figures = result.medians("otel")
    for mode in ("off", "sdk", "exporter"):
        for figure in ("jobs_per_s", "enqueue_single_per_s", "enqueue_cpu_us"):
            assert figures[f"otel_{mode}_{figure}"] > 0, (mode, figure)
        # CPU is counted in clock ticks: a drain this small may spend less than one.
        assert figures[f"otel_{mode}_worker_cpu_us_per_job"] >= 0


def test_batch_scenario_at_ci_size(admin_url: str, tmp_path: Path) -> None:
    """`--scenarios batch` (bench/batch.py) at a small size: one callback, stored in the
    transaction that ended the last job; the 100,000-job run is bench/results' batch file."""
    result = run_bench(
        admin_url, tmp_path, "--scenarios", "batch", "--jobs", "300", "--repeats", "1"
    )
    batch = result.medians("batch")
    assert batch["batch_callback_runs"] == 1.0 and batch["batch_jobs"] == 300.0
    assert batch["batch_callback_started_after_last_ms"] >= batch["batch_completed_after_last_ms"]
    assert batch["batch_drain_per_s"] > 0 and batch["plain_drain_per_s"] > 0
    assert_left_nothing(admin_url, result)
