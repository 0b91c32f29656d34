"""One job's data never touches its neighbours, against real `hivejobs run`.

Hostile or unlucky input (an error text Postgres cannot store, a completion that cannot be
written, a foreign id in a list, a wrong-typed Redis key, a malformed notification, a huge
result or error, a stray child process) must hurt only its own job, type or notification.
Waits poll with deadlines; the handlers' ledger says what ran where.
"""

from __future__ import annotations

import json
import os
import signal
import uuid
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
import redis

from hivejobs import App
from tests.apps.gate import open_gate
from tests.harness import (
    REDIS_URL,
    Instance,
    alive,
    fleet_app,
    ledger_oks,
    ledger_starts,
    live_jobs,
    pool_pids,
    read_ledger,
    sql,
    wait_until,
)

pytestmark = pytest.mark.faults
# A NOTIFY sent before the coordinator listens is lost: tests wait until it listens.
LISTENING = (
    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
    " AND query = 'LISTEN hivejobs_chain'"
)

APP = "tests.apps.isolationapp:app"
MSG_FOREIGN = "foreign job id dropped"


def archived(url: str, ids: list[str]) -> dict[str, tuple[str, str | None, bytes | None]]:
    rows = sql(
        url, "SELECT id, state, error, result FROM hivejobs_archive WHERE id = ANY(%s)", (ids,)
    )
    return {r[0]: (r[1], r[2], None if r[3] is None else bytes(r[3])) for r in rows}


def insert_job(
    url: str,
    name: str,
    payload: dict[str, object],
    *,
    delivery: str = "at_least_once",
    state: str = "queued",
    queued_at: str = "now() - interval '1 minute'",
    worker_id: str | None = None,
    attempts: int = 1,
) -> str:
    """A job row written straight into Postgres, with no Redis push (only the reconciler,
    a notification or the rescuer can dispatch it)."""
    job_id = str(uuid.uuid4())
    attempt = 1 if state == "running" else 0
    sql(
        url,
        "INSERT INTO hivejobs_job (id, name, state, attempt, attempts, delivery, payload,"
        f" queued_at, worker_id, claim_token, started_at) VALUES (%s, %s, %s, %s, %s, %s, %s,"
        f" {queued_at}, %s, %s, CASE WHEN %s THEN now() END)",
        (
            job_id,
            name,
            state,
            attempt,
            attempts,
            delivery,
            json.dumps(payload).encode(),
            worker_id,
            1 if state == "running" else None,
            state == "running",
        ),
    )
    return job_id


def archive_copy(url: str, job_id: str, marker: str) -> None:
    """An archive row with a live job's id: the live row can then never be archived."""
    sql(
        url,
        "INSERT INTO hivejobs_archive (id, name, state, priority, attempt, attempts, delivery,"
        " payload, created_at, run_at, error) SELECT id, name, 'succeeded', priority, attempt,"
        " attempts, delivery, payload, created_at, run_at, %s FROM hivejobs_job WHERE id = %s",
        (marker, job_id),
    )


def test_unstorable_error_fails_only_its_job(
    make_app: Callable[..., App],
    start_instance: Callable[..., Instance],
    database_url: str,
    ledger_dir: Path,
) -> None:
    """A surrogate in an error text among 40 innocent jobs: each innocent job succeeds once,
    the pool never restarts, and the bad job ends failed with a storable version of its error."""
    inst = start_instance({"HJ_TYPES": "a"}, app_spec=APP)
    app = fleet_app(make_app, database_url, ["a"])
    pid = pool_pids(database_url, "a")[0]
    payloads: list[dict[str, object]] = [{"ms": 500}] * 40
    payloads.insert(3, {"ms": 500, "do": "surrogate"})
    ids = app.enqueue_many("a", payloads)
    bad = ids.pop(3)
    wait_until(lambda: live_jobs(database_url) == 0, timeout=60, what="all jobs finished")
    starts = ledger_starts(ledger_dir)
    rows = archived(database_url, [*ids, bad])
    # One comparison, so that a failure shows every count at once.
    summary = {
        "pool pids": pool_pids(database_url, "a"),
        "innocent jobs not run exactly once": len([i for i in ids if starts[i] != 1]),
        "innocent jobs not succeeded": len([i for i in ids if rows[i][0] != "succeeded"]),
        "bad job": rows[bad][0],
    }
    assert summary == {
        "pool pids": [pid],
        "innocent jobs not run exactly once": 0,
        "innocent jobs not succeeded": 0,
        "bad job": "failed",
    }
    error = rows[bad][1]
    assert error is not None and "RuntimeError: file caf\\xe9" in error
    assert "pool thread crashed" not in inst.log_text()


def test_unwritable_completion_blocks_no_other(
    make_app: Callable[..., App],
    start_instance: Callable[..., Instance],
    database_url: str,
    ledger_dir: Path,
) -> None:
    """A completion that can never be written (its id is already in the archive) is set aside:
    the pool's later completions are written, and the archived record is kept."""
    inst = start_instance({"HJ_TYPES": "a"}, app_spec=APP)
    app = fleet_app(make_app, database_url, ["a"])
    pid = pool_pids(database_url, "a")[0]
    stuck = app.enqueue("a", {"gate": "stuck"})
    wait_until(lambda: ledger_starts(ledger_dir)[stuck], what="the job to start")
    archive_copy(database_url, stuck, "archived before")  # while its handler is held
    open_gate(app.connections.broker, "stuck")
    # Its handler has returned: its completion is being written when the others finish.
    wait_until(lambda: ledger_oks(ledger_dir)[stuck], what="the job's handler to return")
    others = app.enqueue_many("a", [{"ms": 50}] * 10)
    wait_until(lambda: live_jobs(database_url) == 0, timeout=30, what="all jobs finished")
    rows = archived(database_url, [*others, stuck])
    assert [i for i in others if rows[i][0] != "succeeded"] == []
    assert rows[stuck][1] == "archived before"
    assert pool_pids(database_url, "a") == [pid]
    log = inst.log_text()
    assert stuck in log and "already in the archive" in log


def test_rescue_not_blocked_by_one_row(
    start_instance: Callable[..., Instance], database_url: str, ledger_dir: Path
) -> None:
    """Two dead workers: one holds a job whose id is already archived. The other's job is
    still rescued and run, and no rescue pass fails."""
    inst = start_instance({"HJ_TYPES": "a,b"}, app_spec=APP)
    wait_until(lambda: pool_pids(database_url, "a") and pool_pids(database_url, "b"))
    dead = [str(uuid.uuid4()), str(uuid.uuid4())]
    for worker in dead:
        sql(
            database_url,
            "INSERT INTO hivejobs_worker (id, host, pid, role, pool, heartbeat_at)"
            " VALUES (%s, 'gone', 1, 'pool', 'a', now() - interval '1 hour')",
            (worker,),
        )
    clash = insert_job(
        database_url, "b", {}, delivery="at_most_once", state="running", worker_id=dead[0]
    )
    archive_copy(database_url, clash, "archived before")
    innocent = insert_job(database_url, "a", {}, state="running", worker_id=dead[1], attempts=3)
    wait_until(
        lambda: archived(database_url, [innocent]).get(innocent, ("",))[0] == "succeeded",
        timeout=40,
        what="the innocent job rescued and run",
    )
    wait_until(lambda: live_jobs(database_url) == 0, timeout=10, what="the clash resolved")
    assert archived(database_url, [clash])[clash][1] == "archived before"
    assert ledger_starts(ledger_dir)[clash] == 0
    assert "'step': 'rescue'" not in inst.log_text()  # no rescue pass failed


def test_foreign_ids_are_dropped(
    start_instance: Callable[..., Instance],
    database_url: str,
    redis_prefix: str,
    ledger_dir: Path,
) -> None:
    """Ids of type `a` pushed into `b`'s list, directly or by a forged dispatch notification,
    are never claimed by `b`'s pool: dropped, logged once per list with the key, counted."""
    # The pool's counters (foreign_ids) are a DEBUG line.
    inst = start_instance({"HJ_TYPES": "b", "HIVEJOBS_LOG_LEVEL": "DEBUG"}, app_spec=APP)
    wait_until(lambda: pool_pids(database_url, "b"), what="pool b")
    key, forged_key = f"{redis_prefix}{{b}}:p0", f"{redis_prefix}{{b}}:p1"
    later = "now() + interval '1 hour'"  # out of the reconciler's reach
    pushed = [insert_job(database_url, "a", {}, queued_at=later) for _ in range(2)]
    forged = insert_job(database_url, "a", {}, queued_at=later)
    own = insert_job(database_url, "b", {}, delivery="at_most_once")
    client = redis.Redis.from_url(REDIS_URL)
    client.rpush(key, *pushed, own)  # one pop takes both foreign ids, the next one b's own
    client.close()
    wait_until(lambda: sql(database_url, LISTENING)[0][0], what="the coordinator listening")
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("SELECT pg_notify('hivejobs_dispatch', %s)", (f"b\t1\t{forged}",))
    wait_until(
        lambda: archived(database_url, [own]).get(own, ("",))[0] == "succeeded",
        what="b's own job",
    )
    wait_until(lambda: inst.log_text().count(MSG_FOREIGN) == 2, what="a drop in each list")
    inst.signal_group(signal.SIGTERM)
    assert inst.wait(20) == 0
    rows = sql(
        database_url,
        "SELECT id, state, attempt FROM hivejobs_job WHERE id = ANY(%s)",
        ([*pushed, forged],),
    )
    assert sorted(rows) == sorted((i, "queued", 0) for i in [*pushed, forged])
    starts = ledger_starts(ledger_dir)
    assert [starts[i] for i in [*pushed, forged]] == [0, 0, 0]
    log = inst.log_text()
    assert log.count(MSG_FOREIGN) == 2 and key in log and forged_key in log
    assert "'foreign_ids': 3" in log


def test_bad_key_or_notification_hurts_only_itself(
    start_instance: Callable[..., Instance],
    database_url: str,
    redis_prefix: str,
) -> None:
    """A wrong-typed Redis key of type `a` does not stop the reconciler from re-pushing `b`'s
    job; a malformed dispatch notification does not drop the valid one after it. The log
    names the key and carries Redis' message."""
    inst = start_instance({"HJ_TYPES": "a,b"}, app_spec=APP)
    wait_until(lambda: pool_pids(database_url, "a") and pool_pids(database_url, "b"))
    bad_key = f"{redis_prefix}{{a}}:p0"
    client = redis.Redis.from_url(REDIS_URL)
    client.set(bad_key, "string")
    insert_job(database_url, "a", {})  # makes the reconciler look at a's lists
    lost = insert_job(database_url, "b", {}, delivery="at_most_once")
    wait_until(
        lambda: archived(database_url, [lost]).get(lost, ("",))[0] == "succeeded",
        timeout=20,
        what="b's job re-pushed by the reconciler",
    )
    notified = insert_job(
        database_url, "b", {}, delivery="at_most_once", queued_at="now() + interval '1 hour'"
    )
    wait_until(lambda: sql(database_url, LISTENING)[0][0], what="the coordinator listening")
    with psycopg.connect(database_url) as conn:
        conn.execute("SELECT pg_notify('hivejobs_dispatch', 'not a dispatch')")
        conn.execute("SELECT pg_notify('hivejobs_dispatch', %s)", (f"b\t0\t{notified}",))
    wait_until(
        lambda: archived(database_url, [notified]).get(notified, ("",))[0] == "succeeded",
        timeout=20,
        what="the notified job after a malformed one",
    )
    client.close()
    log = inst.log_text()
    assert "WRONGTYPE" in log and bad_key in log
    assert "malformed dispatch notifications ignored" in log and "not a dispatch" in log
    assert "ResponseError" in log and "server:ResponseError" not in log


def test_results_and_errors_are_capped(
    make_app: Callable[..., App],
    start_instance: Callable[..., Instance],
    database_url: str,
) -> None:
    """With max_result_bytes 64 KiB: a 200 KB result fails its attempt with a clear error, a
    200 KB error is stored truncated (head and tail kept, with a note), a small result is kept."""
    cap = 65536
    start_instance({"HJ_TYPES": "a", "HIVEJOBS_MAX_RESULT_BYTES": str(cap)}, app_spec=APP)
    app = fleet_app(make_app, database_url, ["a"])
    big_result = app.enqueue("a", {"do": "big_result", "bytes": 200_000})
    big_error = app.enqueue("a", {"do": "big_error", "bytes": 200_000})
    small = app.enqueue("a", {"do": "big_result", "bytes": 1000})
    wait_until(lambda: live_jobs(database_url) == 0, timeout=30, what="all jobs finished")
    rows = archived(database_url, [big_result, big_error, small])
    state, error, result = rows[big_result]
    assert (state, result) == ("failed", None)
    assert error is not None and f"exceeds max_result_bytes ({cap})" in error
    assert "200002 bytes" in error  # the JSON string: 200,000 characters and two quotes
    state, error, _ = rows[big_error]
    assert state == "failed" and error is not None
    assert len(error.encode()) <= cap
    assert "ValueError: head eee" in error and "eee tail" in error and "truncated" in error
    assert rows[small][0] == "succeeded" and rows[small][2] == json.dumps("r" * 1000).encode()


def test_handler_child_ends_with_its_pool(
    make_app: Callable[..., App],
    start_instance: Callable[..., Instance],
    database_url: str,
    ledger_dir: Path,
) -> None:
    """A child process a handler started does not outlive its pool: not when the pool is
    killed, not when the instance shuts down."""
    inst = start_instance({"HJ_TYPES": "a"}, app_spec=APP)
    app = fleet_app(make_app, database_url, ["a"])

    def child_of(job_id: str) -> int:
        rows = [p for p in read_ledger(ledger_dir) if p[0] == "child" and p[1] == job_id]
        return int(rows[0][2]) if rows else 0

    first = app.enqueue("a", {"do": "spawn"})
    child = wait_until(lambda: child_of(first), what="the first child")
    wait_until(lambda: live_jobs(database_url) == 0, what="the first job finished")
    pool = pool_pids(database_url, "a")[0]
    assert alive(child)
    os.kill(pool, signal.SIGKILL)
    wait_until(lambda: not alive(child), timeout=10, what="the child of the killed pool to end")
    wait_until(lambda: [p for p in pool_pids(database_url, "a") if p != pool], what="new pool")
    second = app.enqueue("a", {"do": "spawn"})
    child = wait_until(lambda: child_of(second), what="the second child")
    wait_until(lambda: live_jobs(database_url) == 0, what="the second job finished")
    inst.signal_group(signal.SIGTERM)
    assert inst.wait(20) == 0
    wait_until(lambda: not alive(child), timeout=10, what="the child to end with the instance")
