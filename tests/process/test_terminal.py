"""The worker's terminal, from a real `hivejobs run`: the banner, a line per job (the
traceback on a final failure), JSON lines and levels, a second Ctrl-C that suspends running
jobs at once, and `--reload` on a code change."""

from __future__ import annotations

import json
import os
import signal
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from hivejobs import App, JobContext
from tests.harness import (
    ROOT,
    Instance,
    fleet_app,
    ledger_oks,
    live_jobs,
    pool_pids,
    sql,
    wait_until,
)


def final_state(url: str, job_id: str) -> str | None:
    rows = sql(url, "SELECT state FROM hivejobs_archive WHERE id = %s", (job_id,))
    return rows[0][0] if rows else None


def test_banner_and_a_line_per_job(
    make_app: Callable[..., App],
    start_instance: Callable[..., Instance],
    database_url: str,
    redis_prefix: str,
) -> None:
    # A password in the URL (trust auth ignores it) must never reach the terminal.
    parts = urlsplit(database_url)
    secret_url = urlunsplit(parts._replace(netloc=f"{parts.username}:s3cret-pw@{parts.hostname}"))
    inst = start_instance({"HJ_TYPES": "alo,raises", "HIVEJOBS_DATABASE_URL": secret_url})
    first_pass = "first start on this Redis prefix"
    wait_until(lambda: first_pass in inst.log_text(), what="the coordinator's first pass")
    app = fleet_app(make_app, database_url, ["alo", "raises"])
    ok = app.enqueue("alo", {"ms": 5})
    bad = app.enqueue("raises", {})
    wait_until(lambda: final_state(database_url, ok) == "succeeded", what="alo job")
    wait_until(lambda: final_state(database_url, bad) == "failed", what="raises job")
    wait_until(lambda: f"raises[{bad}] failed, no attempts left" in inst.log_text(), what="line")
    inst.signal_group(signal.SIGTERM)
    assert inst.wait(20) == 0
    log = inst.log_text()
    assert "s3cret-pw" not in log
    head = log.split("job types", 1)[0]
    assert "hivejobs " in head and f"postgres     postgresql://{parts.username}:***@" in head
    assert f"prefix       {redis_prefix}" in head and "redis        redis://" in head
    assert "alo     concurrency 8, at_least_once, attempts 5" in log
    assert "raises  concurrency 2, at_least_once, attempts 3" in log
    # A first start against an empty Redis is no news: nothing above INFO but the retries.
    assert [line for line in loud_lines(log) if "raises[" not in line] == []
    lines = log.splitlines()
    # One line per job at INFO, its outcome's (the "started" line is DEBUG).
    assert any(
        f"alo[{ok}] succeeded in 0.0" in line and line.endswith("{'attempt': 1}") for line in lines
    )
    assert f"alo[{ok}] started" not in log
    assert log.count(f"raises[{bad}] failed, retry in") == 2
    failed_at = next(i for i, line in enumerate(lines) if f"raises[{bad}] failed, no" in line)
    assert lines[failed_at + 1] == "Traceback (most recent call last):"
    assert "ValueError: always fails" in lines[failed_at + 2 : failed_at + 12]
    assert "'pops'" not in log  # internal counters are DEBUG


def loud_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if " WARNING " in line or " ERROR " in line]


@pytest.mark.faults
def test_first_start_while_jobs_are_enqueued_is_no_news(
    make_app: Callable[..., App],
    start_instance: Callable[..., Instance],
    database_url: str,
    ledger_dir: Path,
) -> None:
    """The coordinator's first pass on a fresh prefix, with jobs enqueued throughout: some are
    committed but not pushed yet, or popped but not claimed yet, and get pushed again. That is
    no flush: no WARNING, and each job runs once. A failpoint holds the first pass between
    its reads of Postgres and Redis for a second, so that the pools pop meanwhile."""
    app = make_app()

    @app.job("alo", concurrency=8, attempts=5)  # as tests.apps.faultapp declares it
    def alo(ctx: JobContext, payload: dict[str, float | str]) -> None: ...

    app.connections.store.upsert_job_types([app.types["alo"].info()])
    ids: list[str] = []
    stop = threading.Event()

    def enqueue_loop() -> None:
        while not stop.is_set():
            ids.append(app.enqueue("alo", {"ms": 1}))

    thread = threading.Thread(target=enqueue_loop)
    thread.start()
    try:
        wait_until(lambda: len(ids) >= 20, what="jobs enqueued before the start")
        inst = start_instance(
            {"HJ_TYPES": "alo", "HIVEJOBS_FAILPOINTS": "coord.between_restore_reads=sleep:1"}
        )
        wait_until(lambda: "boot marker" in inst.log_text(), what="the first pass")
        after = len(ids)
        wait_until(lambda: len(ids) >= after + 200, what="jobs enqueued after the first pass")
    finally:
        stop.set()
        thread.join()
    wait_until(lambda: live_jobs(database_url) == 0, timeout=60, what="all jobs finished")
    oks = ledger_oks(ledger_dir)
    assert [i for i in ids if oks[i] != 1] == []
    inst.signal_group(signal.SIGTERM)
    assert inst.wait(20) == 0
    assert loud_lines(inst.log_text()) == []


def test_json_lines_and_debug_level(
    start_instance: Callable[..., Instance], database_url: str
) -> None:
    inst = start_instance(
        {"HJ_TYPES": "alo"}, args=["--log-format", "json", "--log-level", "debug"]
    )
    wait_until(lambda: pool_pids(database_url, "alo"), what="alo pool")
    inst.signal_group(signal.SIGTERM)
    assert inst.wait(20) == 0
    records = [json.loads(line)["record"] for line in inst.log_text().splitlines()]
    start = next(r for r in records if r["message"] == "worker starting")
    assert start["extra"]["job_types"]["alo"]["concurrency"] == 8
    counters = next(r for r in records if r["message"] == "pool counters")
    assert counters["level"]["name"] == "DEBUG" and "pops" in counters["extra"]


def test_second_ctrl_c_suspends_running_jobs_at_once(
    make_app: Callable[..., App],
    start_instance: Callable[..., Instance],
    database_url: str,
) -> None:
    inst = start_instance({"HJ_TYPES": "long_stubborn", "HIVEJOBS_SHUTDOWN_TIMEOUT_S": "60"})
    app = fleet_app(make_app, database_url, ["long_stubborn"])
    job_id = app.enqueue("long_stubborn", {"s": 120})
    wait_until(lambda: app.get_job(job_id).state == "running", what="the job running")
    os.kill(inst.pid, signal.SIGINT)  # Ctrl-C reaches the supervisor (pools lead own groups)
    wait_until(
        lambda: "waiting up to" in inst.log_text() and job_id[:8] in inst.log_text(),
        what="the supervisor saying what it waits for",
    )
    assert "for 1 running job(s): long_stubborn" in inst.log_text()
    os.kill(inst.pid, signal.SIGINT)
    assert inst.wait(15) == 0  # long before the 60 s shutdown timeout
    job = app.get_job(job_id)
    assert (job.state, job.attempt) == ("queued", 0)  # suspended, the attempt not counted
    log = inst.log_text()
    assert "second signal: suspending running jobs now" in log
    assert "pool stopped {'suspended': 1" in log


def test_reload_restarts_pools_when_the_code_changes(
    make_app: Callable[..., App],
    start_instance: Callable[..., Instance],
    database_url: str,
    tmp_path: Path,
) -> None:
    package = tmp_path / "reloadable"
    package.mkdir()
    source = package / "__init__.py"
    code = textwrap.dedent(
        """
        from hivejobs import App, JobContext

        app = App()

        @app.job("hello", concurrency=1)
        def hello(ctx: JobContext, payload: None) -> str:
            return "VERSION"
        """
    )
    source.write_text(code.replace("VERSION", "v1"))
    path = os.pathsep.join([str(ROOT / "src"), str(ROOT), str(tmp_path)])
    inst = start_instance({"PYTHONPATH": path}, args=["--reload"], app_spec="reloadable:app")
    app = fleet_app(make_app, database_url, ["hello"])
    first = app.enqueue("hello")
    wait_until(lambda: app.get_job(first).result == "v1", what="v1's result")
    old_pools = pool_pids(database_url, "hello")
    source.write_text(code.replace("VERSION", "v2"))
    wait_until(lambda: "reloading: re-executing" in inst.log_text(), what="the reload")
    wait_until(
        lambda: [p for p in pool_pids(database_url, "hello") if p not in old_pools],
        what="a new pool",
    )
    second = app.enqueue("hello")
    wait_until(lambda: app.get_job(second).result == "v2", what="v2's result")
    assert "code changed: reloading" in inst.log_text() and inst.proc.poll() is None
