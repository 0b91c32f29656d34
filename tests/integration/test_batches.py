"""Batches against real Postgres and Redis, the jobs run by hivejobs.testing.drain (the pool's
claim and finish statements, in this process): the callback's counts and failed ids, the
seal, adds from a running member, the caller's transaction, bad input, and exactly one
callback under concurrent last completions. tests/process/test_batch_run.py runs them under
`hivejobs run` with kill -9.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import msgspec
import psycopg
import pytest

from hivejobs import (
    App,
    BatchClosed,
    BatchDone,
    BatchInvalid,
    BatchNotFound,
    JobContext,
    PayloadInvalid,
)
from hivejobs.records.jobs import Completion
from hivejobs.store import new_worker_id
from hivejobs.testing import drain
from tests.harness import sql, wait_until


class Reports:
    """The callbacks the handlers received, in order (drain runs them in this thread)."""

    def __init__(self) -> None:
        self.done: list[BatchDone] = []

    def of(self, event: str) -> list[BatchDone]:
        return [d for d in self.done if d.event == event]


class Work(msgspec.Struct):
    fail: bool = False
    spawn: int = 0


class NotAReport(msgspec.Struct):
    width: int


@pytest.fixture
def reports() -> Reports:
    return Reports()


@pytest.fixture
def app(make_app: Callable[..., App], reports: Reports) -> App:
    app = make_app()

    @app.job("work", attempts=1)
    def work(ctx: JobContext, payload: Work) -> None:
        if payload.spawn:
            batch = ctx.batch
            assert batch is not None  # the test's jobs with `spawn` are batch members
            batch.enqueue_many("work", [Work()] * payload.spawn)
        if payload.fail:
            raise ValueError("asked to fail")

    @app.job("report")
    def report(ctx: JobContext, done: BatchDone) -> None:
        reports.done.append(done)

    @app.job("plain")
    def plain(ctx: JobContext, payload: dict[str, Any]) -> None:
        reports.done.append(msgspec.convert(payload, BatchDone))

    @app.job("shape")
    def shape(ctx: JobContext, payload: NotAReport) -> None: ...

    return app


def counts(url: str) -> tuple[int, int, int]:
    """Batches, live members, live jobs."""
    row = sql(
        url,
        "SELECT (SELECT count(*) FROM hivejobs_batch), (SELECT count(*) FROM hivejobs_batch_job),"
        " (SELECT count(*) FROM hivejobs_job)",
    )[0]
    return int(row[0]), int(row[1]), int(row[2])


def test_callback_runs_once_with_counts_failed_ids_and_data(app: App, reports: Reports) -> None:
    with app.batch(on_complete="report", on_success="plain", data={"run": 7}) as batch:
        ok = [batch.enqueue("work", Work()) for _ in range(3)]
        bad = batch.enqueue_many("work", [Work(fail=True)] * 2)
    drain(app)
    assert len(reports.done) == 1  # on_success does not run: two jobs failed
    done = reports.done[0]
    assert (done.event, done.batch_id, done.data) == ("complete", batch.id, {"run": 7})
    assert (done.total, done.succeeded, done.failed, done.cancelled, done.expired) == (
        5, 3, 2, 0, 0,
    )  # fmt: skip
    assert done.failed_ids == sorted(bad) and not done.failed_ids_truncated
    status = app.batch_status(batch.id)
    assert (status.state, status.pending, status.complete_job_id) == (
        "complete", 0, f"{batch.id}:complete",
    )  # fmt: skip
    assert status.success_job_id is None
    assert sorted(f.job_id for f in status.failures) == sorted(bad)
    assert not set(ok) & {f.job_id for f in status.failures}
    drain(app)  # nothing more to run: the callback was enqueued once
    assert len(reports.done) == 1


def test_success_callback_when_every_job_succeeded(app: App, reports: Reports) -> None:
    with app.batch(on_complete="report", on_success="plain") as batch:
        batch.enqueue_many("work", [Work()] * 4)
    drain(app)
    assert sorted(d.event for d in reports.done) == ["complete", "success"]
    assert all(d.succeeded == d.total == 4 and d.failed_ids == [] for d in reports.done)


def test_no_callback_before_the_seal_then_once_at_it(app: App, reports: Reports) -> None:
    batch = app.batch(on_complete="report")
    batch.enqueue_many("work", [Work()] * 2)
    drain(app)
    assert reports.done == [] and app.batch_status(batch.id).state == "open"
    batch.enqueue("work", Work())  # still open: anyone may add
    drain(app)
    batch.seal()  # every job has ended: the seal completes it
    batch.seal()  # idempotent
    drain(app)
    assert [(d.total, d.succeeded) for d in reports.done] == [(3, 3)]
    with pytest.raises(BatchClosed, match="complete"):
        batch.enqueue("work", Work())
    batch.seal()  # once the callback has run and left the live table too
    drain(app)
    assert len(reports.done) == 1


def test_empty_batch_completes_at_its_seal(app: App, reports: Reports) -> None:
    with app.batch(on_complete="report"):
        pass
    drain(app)
    assert [(d.total, d.failed_ids) for d in reports.done] == [(0, [])]


def test_running_member_adds_to_its_sealed_batch(
    app: App, reports: Reports, database_url: str
) -> None:
    with app.batch(on_complete="report") as batch:
        batch.enqueue("work", Work(spawn=3))
    with pytest.raises(BatchClosed, match="sealed"):
        batch.enqueue("work", Work())  # an outsider may not add once sealed
    drain(app)
    assert [(d.total, d.succeeded) for d in reports.done] == [(4, 4)]
    assert counts(database_url) == (1, 0, 0)


def test_bad_input_names_the_field_and_stores_nothing(app: App, database_url: str) -> None:
    with pytest.raises(BatchInvalid, match="on_complete.*'reprot'.*did you mean") as bad:
        app.batch(on_complete="reprot")
    assert bad.value.field == "on_complete"
    with pytest.raises(BatchInvalid, match="on_success.*'shape' cannot take the batch report"):
        app.batch(on_success="shape")
    with pytest.raises(BatchInvalid, match="^batch data: "):
        app.batch(on_complete="report", data={"x": object()})
    with pytest.raises(BatchInvalid, match="on_complete: must be a job type name"):
        app.batch(on_complete=3)  # type: ignore[arg-type]
    assert counts(database_url) == (0, 0, 0)

    batch = app.batch(on_complete="report")
    with pytest.raises(PayloadInvalid, match="work"):
        batch.enqueue_many("work", [Work(), {"fail": "yes"}])
    with pytest.raises(BatchNotFound, match="no batch with id 'nope'"):
        app.batch_status("nope")
    from hivejobs.client.batches import Batch

    with pytest.raises(BatchNotFound, match="'nope'"):
        Batch(app._core, "nope").enqueue_many("work", [Work()])
    with pytest.raises(BatchNotFound):
        Batch(app._core, "nope").seal()
    assert counts(database_url) == (1, 0, 0)
    assert app.batch_status(batch.id).total == 0


def test_in_the_callers_transaction_only_a_commit_adds(
    app: App, reports: Reports, database_url: str
) -> None:
    with psycopg.connect(database_url) as conn:
        batch = app.batch(on_complete="report", conn=conn)
        batch.enqueue("work", Work(), conn=conn)
        conn.rollback()
    assert counts(database_url) == (0, 0, 0)
    with psycopg.connect(database_url) as conn:
        with app.batch(on_complete="report", conn=conn) as batch:
            batch.enqueue("work", Work(), conn=conn)
            batch.enqueue_many("work", [Work(fail=True)], conn=conn)
        assert counts(database_url) == (0, 0, 0)  # not committed yet
        conn.commit()
    drain(app)
    assert [(d.total, d.failed) for d in reports.done] == [(2, 1)]


def test_async_batch(app: App, reports: Reports) -> None:
    async def main() -> str:
        async with await app.abatch(on_complete="report", data="a") as batch:
            await batch.enqueue("work", Work())
            await batch.enqueue_many("work", [Work(fail=True)] * 2)
        await app.aclose()
        return batch.id

    batch_id = asyncio.run(main())
    drain(app)
    assert [(d.batch_id, d.total, d.failed, d.data) for d in reports.done] == [
        (batch_id, 3, 2, "a")
    ]


def test_async_batch_in_the_callers_transaction(
    app: App, reports: Reports, database_url: str
) -> None:
    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(database_url) as conn:
            batch = await app.abatch(on_complete="report", conn=conn)
            await batch.enqueue("work", Work(), conn=conn)
            await conn.rollback()
            assert counts(database_url) == (0, 0, 0)
            async with await app.abatch(on_complete="report", conn=conn) as batch:
                await batch.enqueue_many("work", [Work()] * 2, conn=conn)
            assert counts(database_url) == (0, 0, 0)
            await conn.commit()
        await app.aclose()

    asyncio.run(main())
    drain(app)
    assert [(d.total, d.succeeded) for d in reports.done] == [(2, 2)]


def test_concurrent_last_completions_enqueue_one_callback(app: App, database_url: str) -> None:
    """Many transactions end the batch's last jobs at once: the counters under the batch
    row's lock see every one, and exactly one of them stores the callback."""
    with app.batch(on_complete="report") as batch:
        ids = batch.enqueue_many("work", [Work()] * 64)
    store = app.connections.store
    worker = new_worker_id()
    with store.connection() as conn:
        claimed = store.claim_queued(ids, worker, conn, name="work")
    assert len(claimed) == 64
    start = threading.Barrier(8)
    errors: list[BaseException] = []

    def finish(part: list[Completion]) -> None:
        try:
            start.wait(10)
            with store.connection() as conn:
                for c in part:  # one transaction per job: as many racing ends as possible
                    store.finish([c], conn)
        except BaseException as exc:
            errors.append(exc)

    done = [Completion(id=c.id, claim_token=c.claim_token, outcome="succeeded") for c in claimed]
    threads = [threading.Thread(target=finish, args=(done[i::8],)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    rows = sql(database_url, "SELECT id FROM hivejobs_job WHERE name = 'report'")
    assert rows == [(f"{batch.id}:complete",)]
    status = app.batch_status(batch.id)
    assert (status.state, status.total, status.pending, status.succeeded) == (
        "complete", 64, 0, 64,
    )  # fmt: skip


def test_the_last_two_ends_overlapping_store_one_callback(app: App, database_url: str) -> None:
    """The batch's last two jobs end in two transactions open at once: the second waits for
    the first's batch row lock, then sees the count the first left, so one of them stores
    the callback (deciding from a snapshot instead, each would see the other's job still
    live, and neither would)."""
    with app.batch(on_complete="report") as batch:
        ids = batch.enqueue_many("work", [Work()] * 2)
    store = app.connections.store
    with store.connection() as conn:
        claimed = store.claim_queued(ids, new_worker_id(), conn, name="work")
    first, second = (
        Completion(id=c.id, claim_token=c.claim_token, outcome="succeeded") for c in claimed
    )
    errors: list[BaseException] = []

    def end_second() -> None:
        try:
            with psycopg.connect(database_url, autocommit=True) as conn:
                store.finish([second], conn)
        except BaseException as exc:
            errors.append(exc)

    with psycopg.connect(database_url) as open_conn:  # the first end, not committed yet
        store.finish([first], open_conn)
        thread = threading.Thread(target=end_second)
        thread.start()
        wait_until(
            lambda: not thread.is_alive() or waiting_on_lock(database_url),
            what="the second end blocked on the batch row (or done)",
        )
        open_conn.commit()
    thread.join(30)
    assert errors == []
    rows = sql(database_url, "SELECT id FROM hivejobs_job WHERE name = 'report'")
    assert rows == [(f"{batch.id}:complete",)]


def waiting_on_lock(url: str) -> bool:
    rows = sql(
        url,
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND wait_event_type = 'Lock'",
    )
    return bool(rows[0][0])


def test_the_pruner_drops_complete_batches_past_retention(app: App, database_url: str) -> None:
    from hivejobs.coordinator.pruner import Pruner

    with app.batch(on_complete="report") as done:
        done.enqueue("work", Work(fail=True))
    drain(app)
    still_open = app.batch(on_complete="report")
    still_open.enqueue("work", Work())
    drain(app)
    Pruner(app.connections.store, retention_s=3600.0).prune(lambda: True)
    assert counts(database_url)[0] == 2  # within retention: kept
    Pruner(app.connections.store, retention_s=0.0).prune(lambda: True)
    with pytest.raises(BatchNotFound):
        app.batch_status(done.id)
    assert sql(database_url, "SELECT count(*) FROM hivejobs_batch_failed") == [(0,)]
    assert app.batch_status(still_open.id).state == "open"
