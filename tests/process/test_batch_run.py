"""Batches under a real `hivejobs run`: the callback runs once with the right counts and
failed ids when the pool running the batch's last job is killed -9, and when the coordinator
is killed -9 as the last job ends (its dispatch NOTIFY may reach no one: the next
coordinator's reconciler pushes the callback). The pool kill runs with `def` and `async def`
handlers alike."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest

from hivejobs import App, Batch
from tests.apps.gate import open_gate
from tests.harness import (
    HANDLER_KINDS,
    REDIS_URL,
    Instance,
    alive,
    fleet_app,
    handler_env,
    read_ledger,
    sql,
    wait_until,
)
from tests.process.cli import cli_env, hivejobs

APP = "tests.apps.batchapp:app"
TYPES = ["bwork", "breport", "bsuccess"]


def reports(ledger: Path) -> list[list[str]]:
    return [parts for parts in read_ledger(ledger) if parts[0] == "report"]


def running_pid(ledger: Path, job_id: str) -> int | None:
    """The pid of the process that started `job_id` and has not ended it."""
    lines = read_ledger(ledger)
    starts = [int(p[3]) for p in lines if p[0] == "start" and p[1] == job_id]
    ended = any(p[0] == "end" and p[1] == job_id for p in lines)
    return starts[-1] if starts and not ended else None


def settled(url: str, batch: Batch) -> bool:
    """Complete, its callback archived, no live job left: nothing can run a callback again."""
    status = batch.status()
    live = sql(url, "SELECT count(*) FROM hivejobs_job")[0][0]
    done = sql(
        url,
        "SELECT count(*) FROM hivejobs_archive WHERE id = %s",
        (status.complete_job_id or "-",),
    )[0][0]
    return status.state == "complete" and live == 0 and done == 1


def start_batch(app: App, gate: str) -> tuple[Batch, list[str], str]:
    """30 quick jobs, 3 that fail every attempt, and one held at `gate`: the last to end."""
    with app.batch(on_complete="breport", on_success="bsuccess") as batch:
        batch.enqueue_many("bwork", [{"ms": 5}] * 30)
        bad = batch.enqueue_many("bwork", [{"fail": True}] * 3)
        last = batch.enqueue("bwork", {"gate": gate})
    return batch, bad, last


def wait_all_but(url: str, last: str, ledger: Path) -> int:
    """Until only `last` is live, and running; the pid that runs it."""
    wait_until(
        lambda: [r[0] for r in sql(url, "SELECT id FROM hivejobs_job")] == [last],
        timeout=60,
        what="every job of the batch but the last ended",
    )
    pid: int = wait_until(lambda: running_pid(ledger, last), what="the last job running")
    return pid


def assert_one_report(ledger: Path, batch: Batch, bad: list[str], kind: str = "def") -> None:
    assert reports(ledger) == [
        ["report", batch.id, "complete", "34", "31", "3", ",".join(sorted(bad)), kind]
    ]


@pytest.mark.parametrize("kind", HANDLER_KINDS)
def test_callback_once_when_the_pool_running_the_last_job_is_killed(
    make_app: Callable[..., App],
    start_instance: Callable[..., Instance],
    database_url: str,
    ledger_dir: Path,
    kind: str,
) -> None:
    start_instance(handler_env(kind), app_spec=APP)
    app = fleet_app(make_app, database_url, TYPES)
    batch, bad, last = start_batch(app, "last")
    victim = wait_all_but(database_url, last, ledger_dir)
    os.kill(victim, signal.SIGKILL)
    wait_until(lambda: not alive(victim), what="the pool killed")
    open_gate(app.connections.broker, "last")
    # Rescued once its heartbeat is stale (stuck_after_s), run again, then the callback.
    wait_until(lambda: settled(database_url, batch), timeout=60, what="the batch settled")
    assert_one_report(ledger_dir, batch, bad, kind)
    assert {p[4] for p in read_ledger(ledger_dir) if p[0] == "start"} == {kind}
    attempts = sql(database_url, "SELECT attempt FROM hivejobs_archive WHERE id = %s", (last,))
    assert attempts == [(2,)]  # the killed attempt counted, the re-run ended the batch
    status = batch.status()
    assert (status.total, status.succeeded, status.failed, status.success_job_id) == (
        34, 31, 3, None,
    )  # fmt: skip


def test_callback_once_when_the_coordinator_is_killed_as_the_last_job_ends(
    make_app: Callable[..., App],
    start_instance: Callable[..., Instance],
    database_url: str,
    ledger_dir: Path,
) -> None:
    start_instance(app_spec=APP)
    app = fleet_app(make_app, database_url, TYPES)
    batch, bad, last = start_batch(app, "last")
    wait_all_but(database_url, last, ledger_dir)
    rows = sql(
        database_url,
        "SELECT w.pid FROM hivejobs_leader l JOIN hivejobs_worker w ON w.id = l.holder",
    )
    coordinator = int(rows[0][0])
    os.kill(coordinator, signal.SIGKILL)
    open_gate(app.connections.broker, "last")  # the last job ends while no coordinator listens
    wait_until(lambda: settled(database_url, batch), timeout=60, what="the batch settled")
    assert_one_report(ledger_dir, batch, bad)


def test_members_add_jobs_and_on_success_runs_once(
    make_app: Callable[..., App],
    start_instance: Callable[..., Instance],
    database_url: str,
    ledger_dir: Path,
) -> None:
    start_instance(app_spec=APP)
    app = fleet_app(make_app, database_url, TYPES)
    with app.batch(on_complete="breport", on_success="bsuccess") as batch:
        batch.enqueue_many("bwork", [{"spawn": 5}] * 4)
    wait_until(lambda: len(reports(ledger_dir)) == 2, timeout=60, what="both callbacks")
    wait_until(lambda: sql(database_url, "SELECT count(*) FROM hivejobs_job")[0][0] == 0)
    assert sorted(reports(ledger_dir)) == [
        ["report", batch.id, "complete", "24", "24", "0", "-", "def"],
        ["report", batch.id, "success", "24", "24", "0", "-", "def"],
    ]

    env = cli_env(HIVEJOBS_DATABASE_URL=database_url, HIVEJOBS_REDIS_URL=REDIS_URL)
    shown = hivejobs(["batch", "status", batch.id], env)
    assert shown.returncode == 0, shown.stderr
    assert "state        complete" in shown.stdout and "total        24" in shown.stdout
    assert f"breport -> {batch.id}:complete" in shown.stdout
    as_json = hivejobs(["batch", "status", batch.id, "--json"], env)
    assert msgspec.json.decode(as_json.stdout)["success_job_id"] == f"{batch.id}:success"
    unknown = hivejobs(["batch", "status", "nope"], env)
    assert (unknown.returncode, unknown.stderr) == (1, "hivejobs: no batch with id 'nope'\n")
    bad = hivejobs(["batch", "status", batch.id, "--failures", "-1"], env)
    assert bad.returncode == 2 and "batch failures: must be a count" in bad.stderr
