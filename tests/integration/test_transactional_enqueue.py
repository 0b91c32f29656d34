"""Enqueue in the caller's transaction, from psycopg (sync and async), SQLAlchemy and as the
first statement: hivejobs never commits it, and only a commit stores and dispatches the job.
Against real Postgres and Redis, with no worker: what is stored and notified is checked
directly (tests/process/test_transactional_run.py runs the jobs with `hivejobs run`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.pq import TransactionStatus
from sqlalchemy import create_engine, text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from hivejobs import App, Chain, InvalidArgument, JobIdConflict, JobNotFound, PayloadInvalid
from hivejobs.records.dispatch import Push
from hivejobs.store.notify import dispatch_payloads, parse_dispatch
from tests.harness import sql
from tests.integration.test_enqueue import (
    GOOD,
    notes_until_marker,
    queued_ids,
    snapshot,
)


def rows(database_url: str, job_id: str) -> int:
    found = sql(
        database_url,
        "SELECT (SELECT count(*) FROM hivejobs_job WHERE id = %(id)s)"
        " + (SELECT count(*) FROM hivejobs_archive WHERE id = %(id)s)",
        {"id": job_id},
    )
    return int(found[0][0])


def sa_url(database_url: str, driver: str = "psycopg") -> str:
    return database_url.replace("postgresql://", f"postgresql+{driver}://", 1)


def dispatched(listen: psycopg.Connection[Any], database_url: str) -> list[Push]:
    return [p for note in notes_until_marker(listen, database_url) for p in parse_dispatch(note)]


# -- psycopg, sync -----------------------------------------------------------------------


@pytest.mark.parametrize("first", [True, False], ids=["first-statement", "after-others"])
def test_rolled_back_enqueue_stores_pushes_and_notifies_nothing(
    app: App, database_url: str, listener: psycopg.Connection[Any], first: bool
) -> None:
    before = snapshot(app)
    with psycopg.connect(database_url) as conn:  # non-autocommit, as psycopg's default
        if not first:
            conn.execute("SELECT 1")
        job_id = app.enqueue("resize", GOOD, conn=conn)
        # The caller's transaction is still open: hivejobs did not commit it.
        assert conn.info.transaction_status == TransactionStatus.INTRANS
        assert rows(database_url, job_id) == 0
        conn.rollback()
    assert snapshot(app) == before
    assert notes_until_marker(listener, database_url) == []
    with pytest.raises(JobNotFound):
        app.get_job(job_id)


@pytest.mark.parametrize("first", [True, False], ids=["first-statement", "after-others"])
def test_committed_enqueue_is_stored_and_notified_once_on_commit(
    app: App, database_url: str, listener: psycopg.Connection[Any], first: bool
) -> None:
    with psycopg.connect(database_url) as conn:
        if not first:
            conn.execute("SELECT 1")
        job_id = app.enqueue("resize", GOOD, conn=conn)
        assert notes_until_marker(listener, database_url) == []
        conn.commit()
    assert notes_until_marker(listener, database_url) == [f"resize\t0\t{job_id}"]
    assert app.get_job(job_id).state == "queued"
    assert queued_ids(app, "resize") == []  # the coordinator pushes it, on the NOTIFY


def test_savepoint_rolled_back_inside_a_committed_transaction(
    app: App, database_url: str, listener: psycopg.Connection[Any]
) -> None:
    with psycopg.connect(database_url) as conn:
        kept = app.enqueue("resize", GOOD, conn=conn)
        with pytest.raises(RuntimeError), conn.transaction():  # a savepoint of the caller's
            dropped = app.enqueue("resize", GOOD, conn=conn)
            raise RuntimeError("undo the inner block")
        conn.commit()
    assert rows(database_url, kept) == 1
    assert rows(database_url, dropped) == 0
    assert notes_until_marker(listener, database_url) == [f"resize\t0\t{kept}"]


def test_bad_input_leaves_the_callers_transaction_usable(app: App, database_url: str) -> None:
    app.enqueue("resize", GOOD, id="taken")
    with psycopg.connect(database_url) as conn:
        conn.execute("CREATE TEMP TABLE mine (x int)")
        with pytest.raises(PayloadInvalid):
            app.enqueue("resize", {"width": "wide"}, conn=conn)
        with pytest.raises(JobIdConflict):  # three statements, undone by our savepoint
            app.enqueue("resize", {"width": 9, "height": 9}, id="taken", conn=conn)
        with pytest.raises(InvalidArgument):
            app.enqueue("resize", GOOD, priority=99, conn=conn)
        assert conn.info.transaction_status == TransactionStatus.INTRANS
        conn.execute("INSERT INTO mine VALUES (1)")  # not aborted
        job_id = app.enqueue("resize", GOOD, id="taken", conn=conn)  # idempotent inside
        conn.commit()
    assert job_id == "taken"
    assert sql(database_url, "SELECT count(*) FROM hivejobs_job")[0][0] == 1


def test_an_aborted_callers_transaction_gets_a_clear_error(app: App, database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        with pytest.raises(psycopg.errors.DivisionByZero):
            conn.execute("SELECT 1/0")
        with pytest.raises(InvalidArgument, match="roll it back"):
            app.enqueue("resize", GOOD, conn=conn)
        conn.rollback()


def test_enqueue_many_in_the_callers_transaction(
    app: App, database_url: str, listener: psycopg.Connection[Any]
) -> None:
    with psycopg.connect(database_url) as conn:
        dropped = app.enqueue_many("resize", [GOOD] * 50, conn=conn)
        conn.rollback()
        kept = app.enqueue_many("resize", [GOOD] * 700, conn=conn)  # more than one NOTIFY
        assert conn.info.transaction_status == TransactionStatus.INTRANS
        conn.commit()
    assert all(rows(database_url, i) == 0 for i in dropped)
    notified = dispatched(listener, database_url)
    assert sorted(notified) == sorted((i, "resize", 0) for i in kept)
    assert queued_ids(app, "resize") == []


def test_run_chain_in_the_callers_transaction(app: App, database_url: str) -> None:
    def chain() -> Chain:
        c = Chain("two-steps")
        first = c.job("resize", GOOD, key="a")
        c.job("resize", GOOD, key="b", after=[first])
        return c

    with psycopg.connect(database_url) as conn:
        dropped = app.run_chain(chain(), conn=conn)
        conn.rollback()
        kept = app.run_chain(chain(), conn=conn)
        conn.commit()
    ids = [r[0] for r in sql(database_url, "SELECT id FROM hivejobs_chain")]
    assert ids == [kept] and dropped != kept


def test_dispatch_payloads_fit_notify_and_parse_back() -> None:
    pushes = [(f"{n:036d}", "resize", 3) for n in range(1000)]
    payloads = dispatch_payloads(pushes)
    assert len(payloads) > 1 and all(len(p.encode()) < 8000 for p in payloads)
    assert [x for p in payloads for x in parse_dispatch(p)] == pushes
    with pytest.raises(ValueError):
        parse_dispatch("resize\t0")


# -- psycopg, async ----------------------------------------------------------------------


def test_async_enqueue_rolled_back_and_committed(
    app: App, database_url: str, listener: psycopg.Connection[Any]
) -> None:
    async def scenario() -> tuple[str, str, str, list[str]]:
        async with await psycopg.AsyncConnection.connect(database_url) as conn:
            dropped = await app.aenqueue("resize", GOOD, conn=conn)
            await conn.rollback()
            await conn.execute("SELECT 1")
            kept = await app.aenqueue("resize", GOOD, id="async-kept", conn=conn)
            many = await app.aenqueue_many("resize", [GOOD] * 3, conn=conn)
            assert conn.info.transaction_status == TransactionStatus.INTRANS
            await conn.commit()
        own = await app.aenqueue("resize", GOOD)  # its own transaction, pushed at once
        assert (await app.aget_job(own)).state == "queued"
        await app.aclose()
        return dropped, kept, own, many

    dropped, kept, own, many = asyncio.run(scenario())
    assert rows(database_url, dropped) == 0
    notified = dispatched(listener, database_url)
    assert sorted(notified) == sorted((i, "resize", 0) for i in [kept, *many])
    assert queued_ids(app, "resize") == [own]


def test_async_enqueue_bad_input_stores_nothing(app: App, database_url: str) -> None:
    async def scenario() -> None:
        async with await psycopg.AsyncConnection.connect(database_url) as conn:
            with pytest.raises(PayloadInvalid):
                await app.aenqueue("resize", {"width": "wide"}, conn=conn)
            with pytest.raises(InvalidArgument, match="sync connection"):
                await app.aenqueue("resize", GOOD, conn=psycopg.connect(database_url))
            await conn.commit()
        await app.aclose()

    before = snapshot(app)
    asyncio.run(scenario())
    assert snapshot(app) == before


# -- SQLAlchemy --------------------------------------------------------------------------


@pytest.fixture
def engine_url(database_url: str) -> Iterator[str]:
    yield sa_url(database_url)


def test_sqlalchemy_session_rollback_and_commit(
    app: App, database_url: str, engine_url: str, listener: psycopg.Connection[Any]
) -> None:
    engine = create_engine(engine_url)
    try:
        with Session(engine) as session:
            dropped = app.enqueue("resize", GOOD, conn=session)  # first statement
            session.rollback()
            session.execute(text("SELECT 1"))
            kept = app.enqueue("resize", GOOD, conn=session)
            session.commit()
        with engine.connect() as connection:  # a Connection, not a Session
            also = app.enqueue("resize", GOOD, conn=connection)
            connection.commit()
    finally:
        engine.dispose()
    assert rows(database_url, dropped) == 0
    assert rows(database_url, kept) == 1 and rows(database_url, also) == 1
    assert notes_until_marker(listener, database_url) == [
        f"resize\t0\t{kept}",
        f"resize\t0\t{also}",
    ]


def test_sqlalchemy_async_session_rollback_and_commit(
    app: App, database_url: str, engine_url: str
) -> None:
    async def scenario() -> tuple[str, str]:
        engine = create_async_engine(engine_url)
        try:
            async with AsyncSession(engine) as session:
                dropped = await app.aenqueue("resize", GOOD, conn=session)
                await session.rollback()
                kept = await app.aenqueue("resize", GOOD, conn=session)
                await session.commit()
        finally:
            await engine.dispose()
            await app.aclose()
        return dropped, kept

    dropped, kept = asyncio.run(scenario())
    assert rows(database_url, dropped) == 0
    assert rows(database_url, kept) == 1


def test_sqlalchemy_engine_on_another_driver_is_refused(app: App, database_url: str) -> None:
    engine = create_engine(sa_url(database_url))
    with engine.connect() as connection:
        connection.dialect.driver = "psycopg2"  # as an engine made with postgresql+psycopg2
        with pytest.raises(InvalidArgument, match="postgresql\\+psycopg://"):
            app.enqueue("resize", GOOD, conn=connection)
    engine.dispose()


def test_an_unknown_connection_object_is_refused(app: App) -> None:
    with pytest.raises(InvalidArgument, match="conn must be"):
        app.enqueue("resize", GOOD, conn=object())
