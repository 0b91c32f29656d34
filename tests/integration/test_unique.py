"""Unique windows against real Postgres: racing enqueuers store one job per key, by payload
fields and states, in the caller's transaction too; the window ends with time or state."""

from __future__ import annotations

import threading
from collections.abc import Callable

import psycopg
import pytest

from hivejobs import App, InvalidArgument, InvalidJobType, JobContext, JobDuplicate
from tests.harness import sql


def make(make_app: Callable[..., App], **unique: object) -> App:
    app = make_app()

    @app.job("sync_user", unique_for=3600, **unique)  # type: ignore[arg-type]
    def sync_user(ctx: JobContext, payload: dict[str, object]) -> None: ...

    return app


def stored(database_url: str) -> int:
    return int(sql(database_url, "SELECT count(*) FROM hivejobs_job")[0][0])


def test_sixteen_racing_threads_store_one_job(
    make_app: Callable[..., App], database_url: str
) -> None:
    app = make(make_app, unique_by=["user_id"])
    barrier = threading.Barrier(16)
    ids: list[str] = []

    def enqueue(n: int) -> None:
        barrier.wait()
        ids.append(app.enqueue("sync_user", {"user_id": 7, "attempt_no": n}))

    threads = [threading.Thread(target=enqueue, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(ids) == 16 and len(set(ids)) == 1
    assert stored(database_url) == 1
    assert app.enqueue("sync_user", {"user_id": 8}) != ids[0]  # another key
    assert stored(database_url) == 2


def test_key_is_the_whole_payload_in_any_key_order(
    make_app: Callable[..., App], database_url: str
) -> None:
    app = make(make_app)
    first = app.enqueue("sync_user", {"a": 1, "b": 2})
    assert app.enqueue("sync_user", {"b": 2, "a": 1}) == first
    assert app.enqueue("sync_user", {"a": 1, "b": 3}) != first


def test_raise_on_duplicate(make_app: Callable[..., App], database_url: str) -> None:
    app = make(make_app, on_duplicate="raise")
    first = app.enqueue("sync_user", {"a": 1})
    with pytest.raises(JobDuplicate) as caught:
        app.enqueue("sync_user", {"a": 1})
    assert caught.value.existing_id == first
    assert stored(database_url) == 1


def test_a_failed_job_or_a_passed_window_frees_the_key(
    make_app: Callable[..., App], database_url: str
) -> None:
    app = make(make_app)
    first = app.enqueue("sync_user", {"a": 1})
    # The job failed (not one of the default unique states): the key is free again.
    sql(
        database_url,
        "WITH d AS (DELETE FROM hivejobs_job RETURNING *) INSERT INTO hivejobs_archive"
        " (id, name, state, priority, attempt, attempts, delivery, payload, created_at, run_at)"
        " SELECT id, name, 'failed', priority, 1, attempts, delivery, payload, created_at, run_at"
        " FROM d",
    )
    second = app.enqueue("sync_user", {"a": 1})
    assert second != first
    # The window passed: free again, and the prune removes the spent key.
    sql(database_url, "UPDATE hivejobs_unique SET until = now() - interval '1 second'")
    third = app.enqueue("sync_user", {"a": 1})
    assert third not in (first, second)
    sql(database_url, "UPDATE hivejobs_unique SET until = now() - interval '1 second'")
    app.connections.store.prune_archive(7 * 86400.0)
    assert sql(database_url, "SELECT count(*) FROM hivejobs_unique")[0][0] == 0


def test_unique_in_the_callers_transaction(make_app: Callable[..., App], database_url: str) -> None:
    app = make(make_app)
    with psycopg.connect(database_url) as conn:
        dropped = app.enqueue("sync_user", {"a": 1}, conn=conn)
        conn.rollback()  # the key goes with the job
        kept = app.enqueue("sync_user", {"a": 1}, conn=conn)
        assert app.enqueue("sync_user", {"a": 1}, conn=conn) == kept
        conn.commit()
    assert kept != dropped
    assert stored(database_url) == 1


def test_bad_unique_options_and_bulk_are_refused(make_app: Callable[..., App]) -> None:
    app = make_app()
    for bad in (
        {"unique_for": 0},
        {"unique_for": float("nan")},
        {"unique_for": 60, "unique_states": ["queued", "done"]},
        {"unique_for": 60, "unique_by": "user_id"},
        {"unique_for": 60, "on_duplicate": "ignore"},
    ):
        with pytest.raises(InvalidJobType):
            app.job("x", **bad)
    unique = make(make_app, unique_by=["user_id"])
    with pytest.raises(InvalidArgument, match="one by one"):
        unique.enqueue_many("sync_user", [{"user_id": 1}])
