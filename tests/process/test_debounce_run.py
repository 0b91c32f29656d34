"""Debounce and coalesce across processes, run by a real `hivejobs run`.

Two enqueuer processes of 8 threads each (tests/apps/debounceapp.py) race on one key; what
ran, and with which payload, is read from the handlers' ledger. Times are the database
clock's (started_at, run_at against clocks the enqueuers read); nothing sleeps.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from hivejobs import App, JobContext, Unique
from tests.apps.debounceapp import MAX_WAIT_S, THREADS, WITHIN_S
from tests.harness import ROOT, Instance, pool_pids, read_ledger, sql, wait_until

APP = "tests.apps.debounceapp:app"
PER_PROCESS = 16


def runs(ledger: Path, name: str) -> list[tuple[str, Any]]:
    """(job id, payload) of every run of type `name` the handlers wrote down."""
    return [(p[2], json.loads(p[3])) for p in read_ledger(ledger) if p[:2] == ["ran", name]]


def race_processes(name: str, env: dict[str, str]) -> list[dict[str, Any]]:
    """Two enqueuer processes released by one "go" each, PER_PROCESS enqueues apiece."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.apps.debounceapp", name, str(first), str(PER_PROCESS)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=ROOT,
        )
        for first in (0, PER_PROCESS)
    ]
    for proc in procs:  # each connected: the enqueues, not the start-ups, race
        assert proc.stdout is not None
        assert proc.stdout.readline() == "ready\n"
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    outputs = []
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        outputs.append(json.loads(out))
    return outputs


def started(database_url: str, job_id: str) -> tuple[datetime, datetime, datetime]:
    """(created_at, run_at, started_at) of a job, once it has finished."""
    query = "SELECT created_at, run_at, started_at FROM hivejobs_archive WHERE id = %s"
    rows = wait_until(lambda: sql(database_url, query, (job_id,)), what="the job archived")
    return rows[0][0], rows[0][1], rows[0][2]


def test_two_processes_debounce_and_coalesce_into_one_run_each(
    start_instance: Callable[..., Instance],
    database_url: str,
    ledger_dir: Path,
    instance_env: dict[str, str],
) -> None:
    worker = start_instance({}, app_spec=APP)
    for pool in ("debounced", "coalesced"):
        wait_until(lambda p=pool: pool_pids(database_url, p), what=f"the {pool} pool")

    outputs = race_processes("debounced", instance_env)
    ids = {i for out in outputs for i in out["ids"]}
    assert len(ids) == 1
    (job_id,) = ids
    wait_until(lambda: runs(ledger_dir, "debounced"), what="the debounced run")
    ((ran_id, payload),) = runs(ledger_dir, "debounced")
    assert ran_id == job_id
    # The key's last enqueue is some thread's last one: its payload is what ran.
    lasts = {first + t + THREADS for first in (0, PER_PROCESS) for t in range(THREADS)}
    assert payload["items"][0] in lasts
    # It ran after `within` of quiet: no earlier than within after the last enqueue began.
    last_start = max(datetime.fromisoformat(out["last_start"]) for out in outputs)
    _, run_at, started_at = started(database_url, job_id)
    assert started_at >= run_at >= last_start + timedelta(seconds=WITHIN_S)

    outputs = race_processes("coalesced", instance_env)
    ids = {i for out in outputs for i in out["ids"]}
    wait_until(lambda: len(runs(ledger_dir, "coalesced")) >= len(ids), what="the runs")
    assert len(ids) == 1  # all within one window
    ((ran_id, payload),) = runs(ledger_dir, "coalesced")
    assert ran_id in ids
    assert sorted(payload["items"]) == list(range(2 * PER_PROCESS))  # each enqueue once
    started(database_url, ran_id)
    assert len(runs(ledger_dir, "debounced")) == 1  # nothing else ran meanwhile
    worker.signal_group(signal.SIGTERM)
    assert worker.wait(20) == 0


def test_max_wait_runs_a_job_whose_enqueues_never_go_quiet(
    start_instance: Callable[..., Instance],
    make_app: Callable[..., App],
    database_url: str,
    ledger_dir: Path,
) -> None:
    worker = start_instance({}, app_spec=APP)
    wait_until(lambda: pool_pids(database_url, "debounced"), what="the debounced pool")
    app = make_app()
    policy = Unique(key=["key"], within=WITHIN_S, mode="debounce", max_wait=MAX_WAIT_S)

    @app.job("debounced", unique=policy)
    def debounced(ctx: JobContext, payload: dict[str, Any]) -> None: ...

    first = app.enqueue("debounced", {"key": "stream", "items": [0]})
    n = 0

    def next_window() -> bool:  # enqueue without pause until the first job has started
        nonlocal n
        n += 1
        return app.enqueue("debounced", {"key": "stream", "items": [n]}) != first

    wait_until(next_window, interval=0.0, timeout=60, what="a new window")
    wait_until(lambda: runs(ledger_dir, "debounced"), what="the first job's run")
    (ran_id, payload), *_ = runs(ledger_dir, "debounced")
    assert ran_id == first and 0 < payload["items"][0] < n  # a later enqueue's payload ran
    created_at, run_at, started_at = started(database_url, first)
    assert run_at == created_at + timedelta(seconds=MAX_WAIT_S)
    assert started_at >= run_at
    worker.signal_group(signal.SIGTERM)
    assert worker.wait(20) == 0
