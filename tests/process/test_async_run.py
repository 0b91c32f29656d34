"""`async def` handlers in a real `hivejobs run`: tasks on one event loop per
pool, and stop, cancel, timeout, SIGTERM and kill -9 as for thread handlers."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

from hivejobs import App
from tests.apps.gate import open_gate
from tests.harness import Instance, fleet_app, pool_pids, read_ledger, sql, wait_until

APP = "tests.apps.flowapp:app"


def lines(folder: Path, kind: str) -> list[list[str]]:
    return [p for p in read_ledger(folder) if p[0] == kind]


def start(start_instance: Callable[..., Instance], make_app: Callable[..., App], url: str):  # type: ignore[no-untyped-def]
    inst = start_instance({}, app_spec=APP)
    return inst, fleet_app(make_app, url, ["aio", "aio_timeout"])


def test_async_jobs_run_as_tasks_on_one_loop(
    start_instance: Callable[..., Instance],
    make_app: Callable[..., App],
    database_url: str,
    ledger_dir: Path,
) -> None:
    _, app = start(start_instance, make_app, database_url)
    ids = app.enqueue_many("aio", [{"s": 0.6}] * 8)
    infos = [app.wait(i, timeout=30) for i in ids]
    assert {(i.state, i.result) for i in infos} == {("succeeded", "awaited")}
    begins, ends = lines(ledger_dir, "abegin"), lines(ledger_dir, "aend")
    assert len({p[4] for p in begins + ends}) == 1  # one thread: the pool's event loop
    # All 8 awaited at once: every one began before any ended.
    assert max(int(p[3]) for p in begins) < min(int(p[3]) for p in ends)


def test_timeout_and_cancel_reach_the_task_as_cancellation(
    start_instance: Callable[..., Instance],
    make_app: Callable[..., App],
    database_url: str,
    ledger_dir: Path,
) -> None:
    _, app = start(start_instance, make_app, database_url)
    timed = app.enqueue("aio_timeout", {"s": 30})
    info = app.wait(timed, timeout=30)
    # The same error as a hung `def` handler's, not the cancellation the handler saw.
    assert (info.state, info.error) == ("failed", "timed out after 1s")
    running = app.enqueue("aio", {"s": 30})
    wait_until(lambda: app.get_job(running).state == "running", what="the job running")
    wait_until(lambda: lines(ledger_dir, "abegin")[1:], what="its begin line")
    assert app.cancel(running)
    assert app.wait(running, timeout=10).state == "cancelled"
    assert sorted(p[1] for p in lines(ledger_dir, "cancelled")) == sorted([timed, running])
    # The task ended inside the grace: the pool was not recycled for a hung job.
    assert len(pool_pids(database_url, "aio_timeout")) == 1


def test_sigterm_suspends_an_async_job_and_kill_9_reruns_it(
    start_instance: Callable[..., Instance],
    make_app: Callable[..., App],
    database_url: str,
    ledger_dir: Path,
) -> None:
    first, app = start(start_instance, make_app, database_url)
    # At a gate opened only after the kill -9: mid-await at the SIGTERM and at the kill.
    job = app.enqueue("aio", {"gate": "rerun"})
    wait_until(lambda: lines(ledger_dir, "abegin"), what="the job's begin line")
    first_pid = lines(ledger_dir, "abegin")[0][2]
    first.signal_group(signal.SIGTERM)
    assert first.wait(20) == 0
    # Cancelled by the shutdown and suspended: back in the queue, the attempt not counted.
    assert [p[1] for p in lines(ledger_dir, "cancelled")] == [job]
    assert sql(database_url, "SELECT state, attempt FROM hivejobs_job")[0] == ("queued", 0)

    start_instance({}, app_spec=APP)
    wait_until(lambda: len(lines(ledger_dir, "abegin")) == 2, what="the job resumed")
    # The ledger's files come in no order: the new begin line is the other pid's.
    pid = int(next(p[2] for p in lines(ledger_dir, "abegin") if p[2] != first_pid))
    os.kill(pid, signal.SIGKILL)  # its pool dies mid-await: rescued, run again, counted
    open_gate(app.connections.broker, "rerun")
    info = app.wait(job, timeout=60)
    assert (info.state, info.attempt) == ("succeeded", 2)
