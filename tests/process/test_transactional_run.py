"""Transactional enqueue end to end with a real `hivejobs run`: from psycopg (sync and async),
SQLAlchemy (sync and async sessions) and Django, a rolled-back enqueue never runs and a
committed one runs exactly once. "Never runs" is judged after the fleet has drained every
committed job, and a marker enqueued last has run too.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import psycopg
from sqlalchemy import create_engine, text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from hivejobs import App
from tests.harness import ROOT, Instance, fleet_app, ledger_oks, ledger_starts, sql, wait_until

JOB = {"ms": 1}


class Outcomes:
    """Ids the test expects to run once, and ids it expects never to run."""

    def __init__(self) -> None:
        self.committed: list[str] = []
        self.rolled_back: list[str] = []


def from_psycopg(app: App, url: str, out: Outcomes) -> None:
    with psycopg.connect(url) as conn:
        out.rolled_back.append(app.enqueue("alo", JOB, conn=conn))  # first statement
        conn.rollback()
        out.committed.append(app.enqueue("alo", JOB, conn=conn))
        conn.commit()
        conn.execute("SELECT 1")
        out.committed.append(app.enqueue("alo", JOB, id="psycopg-own-id", conn=conn))
        out.committed += app.enqueue_many("alo", [JOB] * 20, conn=conn)
        try:
            with conn.transaction():  # the caller's savepoint, rolled back
                out.rolled_back.append(app.enqueue("alo", JOB, conn=conn))
                out.rolled_back += app.enqueue_many("alo", [JOB] * 5, conn=conn)
                raise LookupError("undo the inner block")
        except LookupError:
            pass
        conn.commit()
        out.rolled_back += app.enqueue_many("alo", [JOB] * 5, conn=conn)
        conn.rollback()


async def from_async_psycopg(app: App, url: str, out: Outcomes) -> None:
    async with await psycopg.AsyncConnection.connect(url) as conn:
        out.rolled_back.append(await app.aenqueue("alo", JOB, conn=conn))
        await conn.rollback()
        out.committed.append(await app.aenqueue("alo", JOB, conn=conn))
        out.committed += await app.aenqueue_many("alo", [JOB] * 5, conn=conn)
        await conn.commit()
    out.committed.append(await app.aenqueue("alo", JOB))  # no conn: its own transaction
    await app.aclose()


def from_sqlalchemy(app: App, url: str, out: Outcomes) -> None:
    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with Session(engine) as session:
            out.rolled_back.append(app.enqueue("alo", JOB, conn=session))
            session.rollback()
            session.execute(text("SELECT 1"))
            out.committed.append(app.enqueue("alo", JOB, conn=session))
            session.commit()
    finally:
        engine.dispose()


async def from_async_sqlalchemy(app: App, url: str, out: Outcomes) -> None:
    engine = create_async_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        async with AsyncSession(engine) as session:
            out.rolled_back.append(await app.aenqueue("alo", JOB, conn=session))
            await session.rollback()
            out.committed.append(await app.aenqueue("alo", JOB, conn=session))
            await session.commit()
    finally:
        await engine.dispose()
        await app.aclose()


def from_django(env: dict[str, str], out: Outcomes) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tests.apps.django_enqueue"],
        env={**env, "DJANGO_SETTINGS_MODULE": "examples.transactions.django_settings"},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    ids = json.loads(done.stdout.strip().splitlines()[-1])
    out.committed += ids["committed"]
    out.rolled_back += ids["rolled_back"]


def test_rolled_back_enqueues_never_run_and_committed_ones_run_once(
    make_app: Callable[..., App],
    start_instance: Callable[..., Instance],
    instance_env: dict[str, str],
    database_url: str,
    ledger_dir: Path,
) -> None:
    start_instance({"HJ_TYPES": "alo"})
    app = fleet_app(make_app, database_url, ["alo"])
    out = Outcomes()
    from_psycopg(app, database_url, out)
    asyncio.run(from_async_psycopg(app, database_url, out))
    from_sqlalchemy(app, database_url, out)
    asyncio.run(from_async_sqlalchemy(app, database_url, out))
    from_django(instance_env, out)
    marker = app.enqueue("alo", JOB)  # last: once it ran, the fleet has seen everything

    def drained() -> bool:
        oks = ledger_oks(ledger_dir)
        return oks[marker] == 1 and all(oks[i] for i in out.committed)

    wait_until(drained, timeout=30, what="every committed job and the marker to run")
    wait_until(
        lambda: sql(database_url, "SELECT count(*) FROM hivejobs_job")[0][0] == 0,
        what="the hot table to drain",
    )
    assert len(out.committed) == 35 and len(out.rolled_back) == 17
    starts = ledger_starts(ledger_dir)
    assert [i for i in out.committed if starts[i] != 1] == []
    assert [i for i in out.rolled_back if starts[i]] == []
    stored = sql(
        database_url, "SELECT id FROM hivejobs_archive WHERE id = ANY(%s)", (out.rolled_back,)
    )
    assert stored == []
    assert os.environ.get("DJANGO_SETTINGS_MODULE") is None  # Django stayed in its process
