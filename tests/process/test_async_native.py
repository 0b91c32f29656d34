"""Async-native pools in a real `hivejobs run`: an `async def` type's jobs are tasks on the
pool process's event loop (no thread per job), a kill -9 loses nothing and runs no
at-most-once job twice, SIGTERM suspends the tasks, and a handler that holds the loop is
reported without its pool being declared dead."""

from __future__ import annotations

import os
import signal
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from hivejobs import App
from tests.apps.gate import open_gate
from tests.harness import Instance, fleet_app, pool_pids, read_ledger, sql, wait_until

APP = "tests.apps.asyncapp:app"
MAX_THREADS = 20


def lines(folder: Path, kind: str) -> list[list[str]]:
    return [p for p in read_ledger(folder) if p[0] == kind]


def began(folder: Path, prefix: str = "") -> Counter[str]:
    """Begin lines per job id."""
    return Counter(p[1] for p in lines(folder, "abegin") if p[1].startswith(prefix))


def threads_of(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def test_500_async_jobs_run_at_once_on_a_few_threads_and_sigterm_suspends_them(
    start_instance: Callable[..., Instance],
    make_app: Callable[..., App],
    database_url: str,
    ledger_dir: Path,
) -> None:
    first = start_instance({"HJ_TYPES": "wide"}, app_spec=APP)
    app = fleet_app(make_app, database_url, ["wide"])
    ids = app.enqueue_many("wide", [{"gate": "wide"}] * 500)
    wait_until(lambda: len(began(ledger_dir)) == 500, timeout=60, what="500 jobs begun")
    [pid] = pool_pids(database_url, "wide")
    # All 500 wait at the gate at once, as tasks: the pool process has a handful of threads.
    assert threads_of(pid) <= MAX_THREADS, threads_of(pid)
    assert sql(database_url, "SELECT count(*) FROM hivejobs_job WHERE state = 'running'") == [
        (500,)
    ]

    first.signal_group(signal.SIGTERM)
    assert first.wait(30) == 0
    # Every task was cancelled by the shutdown and suspended: queued, the attempt uncounted.
    assert len({p[1] for p in lines(ledger_dir, "acancelled")}) == 500
    assert sql(database_url, "SELECT state, attempt, count(*) FROM hivejobs_job GROUP BY 1, 2") == [
        ("queued", 0, 500)
    ]

    start_instance({"HJ_TYPES": "wide"}, app_spec=APP)
    open_gate(app.connections.broker, "wide")
    infos = [app.wait(i, timeout=60) for i in ids]
    assert Counter((i.state, i.attempt) for i in infos) == {("succeeded", 1): 500}


def test_kill_9_of_async_pools_loses_nothing_and_runs_no_at_most_once_job_twice(
    start_instance: Callable[..., Instance],
    make_app: Callable[..., App],
    database_url: str,
    ledger_dir: Path,
) -> None:
    start_instance({"HJ_TYPES": "alo_async,amo_async"}, app_spec=APP)
    app = fleet_app(make_app, database_url, ["alo_async", "amo_async"])
    alo = app.enqueue_many("alo_async", [{"gate": "kill"}] * 20)
    amo = app.enqueue_many("amo_async", [{"gate": "kill"}] * 20)
    # Mid-await in both pools (8 running each, the rest claimed ahead or queued).
    wait_until(lambda: len(began(ledger_dir)) == 16, what="both pools running their first jobs")
    killed = pool_pids(database_url, "alo_async") + pool_pids(database_url, "amo_async")
    assert len(killed) == 2
    for pid in killed:
        os.kill(pid, signal.SIGKILL)
    amo_started = {p[1] for p in lines(ledger_dir, "abegin") if p[1] in set(amo)}
    open_gate(app.connections.broker, "kill")
    alo_infos = [app.wait(i, timeout=90) for i in alo]
    amo_infos = {i: app.wait(i, timeout=90) for i in amo}
    # At-least-once: every job succeeded; those the kill interrupted ran again, counted.
    assert {i.state for i in alo_infos} == {"succeeded"}
    reran = {i.id for i in alo_infos if i.attempt == 2}
    assert len(reran) == 8 and all(began(ledger_dir)[i] == 2 for i in reran)
    # Each ran again alone (a suspect of its pool's death), one after the other.
    spans = sorted(
        (int(b[4]), int(e[4]))
        for b in lines(ledger_dir, "abegin")
        for e in lines(ledger_dir, "aend")
        if b[1] == e[1] and b[1] in reran and b[2] == e[2] == "2"
    )
    assert len(spans) == 8
    assert all(
        prev_end <= begin for (_, prev_end), (begin, _) in zip(spans, spans[1:], strict=False)
    )
    # At-most-once: the jobs that had begun in the killed pool failed and never began again;
    # the others ran once.
    starts = began(ledger_dir)
    assert all(starts[i] == 1 for i in amo)
    assert {i for i, info in amo_infos.items() if info.state == "failed"} == amo_started
    assert all(info.state == "succeeded" for i, info in amo_infos.items() if i not in amo_started)


def test_a_handler_holding_the_loop_is_reported_and_its_pool_not_declared_dead(
    start_instance: Callable[..., Instance],
    make_app: Callable[..., App],
    database_url: str,
    ledger_dir: Path,
) -> None:
    # The loop held for longer than stuck_after_s (5 s in the tests): a heartbeat that
    # needed the loop would let the pool be declared dead and the job run again.
    inst = start_instance({"HJ_TYPES": "blocker"}, app_spec=APP)
    app = fleet_app(make_app, database_url, ["blocker"])
    [pid] = pool_pids(database_url, "blocker")
    job = app.enqueue("blocker", {"block_s": 7.0})
    info = app.wait(job, timeout=60)
    assert (info.state, info.attempt) == ("succeeded", 1)
    assert began(ledger_dir)[job] == 1
    assert pool_pids(database_url, "blocker") == [pid]
    log = inst.log_text()
    assert "declared dead" not in log and "rescued" not in log
    # Reported once, with where: the handler's blocking line.
    reports = [line for line in log.splitlines() if "held the event loop" in line]
    assert len(reports) == 1, reports
    assert "blocks_the_loop" in reports[0] and "time.sleep" in reports[0]
    again = app.enqueue("blocker", {"block_s": 0.3})
    assert app.wait(again, timeout=30).state == "succeeded"
    assert len([ln for ln in inst.log_text().splitlines() if "held the event loop" in ln]) == 1


def spans(folder: Path, ids: list[str]) -> list[tuple[int, int]]:
    """(begin, end) ns of each job's run (one attempt each here)."""
    begins = {p[1]: int(p[4]) for p in lines(folder, "abegin") if p[1] in ids}
    return sorted((begins[p[1]], int(p[4])) for p in lines(folder, "aend") if p[1] in ids)


def test_fleet_limits_hold_for_async_types_across_two_instances(
    start_instance: Callable[..., Instance],
    make_app: Callable[..., App],
    database_url: str,
    ledger_dir: Path,
) -> None:
    env = {"HJ_TYPES": "limited_async,rated_async"}
    start_instance(env, app_spec=APP)
    start_instance(env, app_spec=APP)
    types = ["limited_async", "rated_async"]
    wait_until(lambda: all(len(pool_pids(database_url, t)) == 2 for t in types), what="pools")
    app = fleet_app(make_app, database_url, types)
    limited = app.enqueue_many("limited_async", [{"ms": 300}] * 10)
    rated = app.enqueue_many("rated_async", [{}] * 8)
    for i in limited + rated:
        assert app.wait(i, timeout=90).state == "succeeded"
    # global_concurrency=2: never more than 2 at once in the fleet (16 tasks could run).
    runs = spans(ledger_dir, limited)
    events = sorted([(b, 1) for b, _ in runs] + [(e, -1) for _, e in runs])
    peak = now = 0
    for _, step in events:
        now += step
        peak = max(peak, now)
    assert len(runs) == 10 and peak == 2
    # 5/s with a burst of 1: 8 starts take at least 7 intervals of 0.2 s.
    starts = [b for b, _ in spans(ledger_dir, rated)]
    assert len(starts) == 8 and (starts[-1] - starts[0]) / 1e9 >= 7 * 0.2 * 0.9
