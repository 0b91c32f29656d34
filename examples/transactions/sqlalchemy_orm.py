"""Enqueue in a SQLAlchemy 2 session, sync and async (`pip install 'hivejobs[sqlalchemy]'`).

    python -m examples.transactions.sqlalchemy_orm

The engine must use psycopg 3: a `postgresql+psycopg://` URL. `conn=` takes a Session, an
AsyncSession, or a Connection / AsyncConnection; the session's commit commits the job.
"""

from __future__ import annotations

import asyncio

from sqlalchemy import create_engine, text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from examples.myapp import Resize, app
from hivejobs import JobNotFound


def sync_session(url: str) -> tuple[str, str]:
    engine = create_engine(url)
    with Session(engine) as session:
        session.execute(text("SELECT 1"))  # the request's own statements
        kept = app.enqueue("resize", Resize(url="/k.png", width=1), conn=session)
        session.commit()
        dropped = app.enqueue("resize", Resize(url="/d.png", width=1), conn=session)
        session.rollback()
    engine.dispose()
    return kept, dropped


async def async_session(url: str) -> tuple[str, str]:
    engine = create_async_engine(url)
    async with AsyncSession(engine) as session:
        kept = await app.aenqueue("resize", Resize(url="/k.png", width=1), conn=session)
        await session.commit()
        dropped = await app.aenqueue("resize", Resize(url="/d.png", width=1), conn=session)
        await session.rollback()
    await engine.dispose()
    await app.aclose()
    return kept, dropped


def main() -> None:
    app.connections.resolve()
    url = app.settings.database_url.replace("postgresql://", "postgresql+psycopg://", 1)
    for label, (kept, dropped) in (
        ("Session", sync_session(url)),
        ("AsyncSession", asyncio.run(async_session(url))),
    ):
        try:
            app.get_job(dropped)
        except JobNotFound:
            print(f"{label}: committed {kept}: {app.get_job(kept).state}; rolled back: not found")
    app.close()


if __name__ == "__main__":
    main()
