"""Operating jobs (rickover's semantics) on real `hivejobs run` instances, Redis, Postgres.

Fail ends a job at once, Retry and errors retry it (`def` and `async def` handlers alike);
replay keeps the original options and says what it changed; `restart --pool` and
`--instance` restart only what they name; `hivejobs jobs` and `app.list_jobs` list live and
archived jobs, keyset-paginated; retention per job type.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from hivejobs import App
from hivejobs.store.archive import prune_archive
from tests.harness import (
    HANDLER_KINDS,
    ROOT,
    Instance,
    alive,
    handler_env,
    pool_pids,
    read_ledger,
    sql,
    wait_until,
)


@pytest.fixture
def app15(make_app: Callable[..., App]) -> App:
    from tests.apps.controlapp import app as declared

    app = make_app()
    app.types.update(declared.types)
    return app


@pytest.fixture
def instance15(start_instance: Callable[..., Instance]) -> Callable[..., Instance]:
    def start(types: str, extra_env: dict[str, str] | None = None) -> Instance:
        env = {"HJ_TYPES": types, **(extra_env or {})}
        return start_instance(env, app_spec="tests.apps.controlapp:app")

    return start


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hivejobs", *args],
        cwd=ROOT,
        env={**env, "HIVEJOBS_APP": "tests.apps.controlapp:app"},
        capture_output=True,
        text=True,
        timeout=60,
    )


def final_state(app: App, job_id: str) -> str:
    state: str = wait_until(
        lambda: (s := app.get_job(job_id).state) not in ("queued", "scheduled", "running") and s,
        what=f"job {job_id} to finish",
    )
    return state


@pytest.mark.parametrize("kind", HANDLER_KINDS)
def test_fail_retry_and_errors_end_attempts_as_the_handler_says(
    app15: App, instance15: Callable[..., Instance], ledger_dir: Path, kind: str
) -> None:
    instance15("final,planned", handler_env(kind))
    job_id = app15.enqueue("final", {"card": "4242"})
    retried = app15.enqueue("planned", {"plan": ["retry:1", "ok"]})
    errors = app15.enqueue("planned", {"plan": ["raise", "raise", "raise"]})
    given_up = app15.enqueue("planned", {"plan": ["raise", "fail", "ok"]})
    # Fail ends the job at once, with attempts left.
    assert final_state(app15, job_id) == "failed"
    info = app15.get_job(job_id)
    assert (info.attempt, info.attempts) == (1, 5)
    assert info.error == "Fail: card declined: 4242"
    assert [p[0] for p in read_ledger(ledger_dir) if p[1] == job_id] == ["start", "end"]
    assert final_state(app15, given_up) == "failed"
    info = app15.get_job(given_up)
    assert (info.attempt, info.error) == (2, "Fail: given up on attempt 2")
    # An error retries while attempts are left, then fails with the handler's traceback.
    assert final_state(app15, errors) == "failed"
    info = app15.get_job(errors)
    assert info.attempt == 3 and info.error is not None
    assert info.error.startswith("Traceback") and "in planned" in info.error
    assert info.error.strip().splitlines()[-1] == "ValueError: raised on attempt 3"
    # Retry(delay=1) runs the job again, its attempt counted, not before the delay.
    assert final_state(app15, retried) == "succeeded"
    info = app15.get_job(retried)
    assert (info.attempt, info.result) == (2, "ok on attempt 2")
    starts = [p for p in read_ledger(ledger_dir) if p[0] == "start" and p[1] == retried]
    began = sorted(int(p[4]) for p in starts)
    assert len(began) == 2 and began[1] - began[0] >= 10**9
    planned = [p for p in read_ledger(ledger_dir) if p[0] == "start" and len(p) == 6]
    assert len(planned) == 2 + 3 + 2 and {p[5] for p in planned} == {kind}


def test_replay_keeps_priority_delay_and_expiry_and_says_what_changed(
    app15: App, instance15: Callable[..., Instance], instance_env: dict[str, str]
) -> None:
    instance15("final")
    expires = datetime.now(UTC) + timedelta(seconds=20)
    original = app15.enqueue("final", {"card": "1"}, priority=3, delay=1.0, expires_at=expires)
    assert final_state(app15, original) == "failed"
    replayed = app15.replay_job(original)
    info = app15.get_job(replayed.id)
    assert info.priority == 3
    assert 0.9 <= (info.run_at - info.created_at).total_seconds() <= 1.1  # delayed from now
    assert info.expires_at == app15.get_job(original).expires_at  # not passed: kept as is
    assert replayed.changes == ["run_at: 1s from now, as the original's delay"]
    assert final_state(app15, replayed.id) == "failed"  # and it runs
    # An expiry that has passed moves by the same lifetime, and the CLI says so.
    short = app15.enqueue(
        "final", {"card": "2"}, expires_at=datetime.now(UTC) + timedelta(seconds=1)
    )
    assert final_state(app15, short) in ("failed", "expired")
    expiry = app15.get_job(short).expires_at
    assert expiry is not None
    wait_until(lambda: datetime.now(UTC) > expiry, what="its expiry to pass")
    shown = cli(instance_env, "replay", short)
    assert shown.returncode == 0, shown.stderr
    new = app15.get_job(shown.stdout.strip())
    lifetime = (expiry - app15.get_job(short).created_at).total_seconds()
    assert new.expires_at is not None  # the same lifetime, from the replay on
    assert abs((new.expires_at - new.created_at).total_seconds() - lifetime) < 0.5
    assert "kept priority 0" in shown.stderr
    assert "expires_at:" in shown.stderr and "the original's had passed" in shown.stderr


def supervisor_pools(url: str, supervisor: int, pool: str) -> list[int]:
    return pool_pids(url, pool, host_pid=supervisor)


def test_restart_pool_restarts_only_that_pool(
    app15: App, instance15: Callable[..., Instance], instance_env: dict[str, str]
) -> None:
    url = instance_env["HIVEJOBS_DATABASE_URL"]
    inst = instance15("quick,final")
    wait_until(lambda: pool_pids(url, "quick") and pool_pids(url, "final"), what="pools")
    quick_before, final_before = pool_pids(url, "quick"), pool_pids(url, "final")
    done = cli(instance_env, "restart", "--pool", "quick")
    assert done.returncode == 0, done.stderr
    wait_until(
        lambda: (now := pool_pids(url, "quick")) and now != quick_before,
        what="a new quick pool",
    )
    assert pool_pids(url, "final") == final_before  # untouched
    assert inst.proc.poll() is None and not any(alive(p) for p in quick_before)
    job_id = app15.enqueue("quick", {})
    assert final_state(app15, job_id) == "succeeded"  # the new pool works


def test_restart_instance_restarts_only_that_instance(
    instance15: Callable[..., Instance], instance_env: dict[str, str]
) -> None:
    url = instance_env["HIVEJOBS_DATABASE_URL"]
    a = instance15("quick")
    b = instance15("quick")
    wait_until(
        lambda: supervisor_pools(url, a.pid, "quick") and supervisor_pools(url, b.pid, "quick"),
        what="both instances' pools",
    )
    a_before = supervisor_pools(url, a.pid, "quick")
    b_before = supervisor_pools(url, b.pid, "quick")
    done = cli(instance_env, "restart", "--instance", f"{socket.gethostname()}:{a.pid}")
    assert done.returncode == 0, done.stderr
    # A re-executes itself (same pid, new code) and forks new pools; B goes on as it was.
    wait_until(
        lambda: (now := supervisor_pools(url, a.pid, "quick")) and now != a_before,
        timeout=40,
        what="instance A's new pool",
    )
    assert supervisor_pools(url, b.pid, "quick") == b_before
    assert a.proc.poll() is None and b.proc.poll() is None
    assert "reloading: re-executing the supervisor" in a.log_text()
    assert "reloading" not in b.log_text()


def test_jobs_lists_live_and_archived_jobs_filtered_and_paginated(
    app15: App, instance15: Callable[..., Instance], instance_env: dict[str, str]
) -> None:
    instance15("final,quick")
    failed = [app15.enqueue("final", {"card": str(i)}) for i in range(5)]
    ok = [app15.enqueue("quick", {}) for _ in range(2)]
    later = app15.enqueue("final", {"card": "later"}, delay=600)  # live: scheduled
    for job_id in failed + ok:
        final_state(app15, job_id)

    page = app15.list_jobs(state="failed", type="final", since=timedelta(hours=1), limit=2)
    seen = [j.id for j in page.jobs]
    while page.next is not None:
        page = app15.list_jobs(
            state="failed", type="final", since=timedelta(hours=1), limit=2, after=page.next
        )
        seen += [j.id for j in page.jobs]
    assert sorted(seen) == sorted(failed) and len(seen) == len(set(seen))
    everything = app15.list_jobs(limit=100).jobs
    assert {j.id for j in everything} == set(failed + ok + [later])
    assert [j.id for j in everything if j.state == "scheduled"] == [later]
    assert app15.list_jobs(state="failed", until=datetime.now(UTC) - timedelta(hours=1)).jobs == []

    shown = cli(instance_env, "jobs", "--state", "failed", "--type", "final", "--since", "1h")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].split()[:3] == ["id", "type", "state"]
    assert sorted(x.split()[0] for x in lines[1:]) == sorted(failed)
    assert all("Fail: card declined" in x for x in lines[1:])
    first = cli(instance_env, "jobs", "--type", "final", "--limit", "3")
    assert first.returncode == 0 and len(first.stdout.splitlines()) == 4
    cursor = first.stderr.strip().split("--after ", 1)[1].strip("'")
    rest = cli(instance_env, "jobs", "--type", "final", "--limit", "10", "--after", cursor)
    ids = [x.split()[0] for x in (first.stdout + rest.stdout).splitlines() if x[:2] != "id"]
    assert sorted(ids) == sorted(failed + [later])
    bad = cli(instance_env, "jobs", "--state", "done")
    assert bad.returncode == 2 and "unknown job state 'done'" in bad.stderr


def test_archive_retention_per_job_type(
    app15: App, instance15: Callable[..., Instance], database_url: str
) -> None:
    instance15("final,quick", {"HJ_RETENTION_QUICK": "3600"})
    wait_until(
        lambda: (
            sql(database_url, "SELECT name, retention_s FROM hivejobs_job_type ORDER BY 1")
            == [("final", None), ("quick", 3600.0)]
        ),
        what="the fleet to declare its retentions",
    )
    ids = {name: [app15.enqueue(name, {}) for _ in range(3)] for name in ("final", "quick")}
    for job_ids in ids.values():
        for job_id in job_ids:
            final_state(app15, job_id)
    # Two hours old: past quick's one hour, within the global retention (7 days).
    sql(database_url, "UPDATE hivejobs_archive SET finished_at = now() - interval '2 hours'")
    pruned = prune_archive(app15.connections.store, app15.settings.archive_retention_s)
    assert pruned == 3
    left = sql(database_url, "SELECT name, count(*) FROM hivejobs_archive GROUP BY 1")
    assert left == [("final", 3)]
