"""Enqueue from async code (FastAPI, Litestar, Starlette) without blocking the event loop.

    python -m examples.transactions.psycopg_async

In a web app, open one AsyncConnectionPool at startup, pass a connection of a request's
transaction to `aenqueue`, and `await app.aclose()` at shutdown.
"""

from __future__ import annotations

import asyncio

import psycopg

from examples.myapp import Resize, app
from hivejobs import JobNotFound


async def place_order(conn: psycopg.AsyncConnection[tuple[object, ...]], order_id: str) -> str:
    await conn.execute("CREATE TEMP TABLE IF NOT EXISTS example_order (id text PRIMARY KEY)")
    await conn.execute("INSERT INTO example_order VALUES (%s)", (order_id,))
    job = Resize(url=f"/orders/{order_id}.png", width=200)
    return await app.aenqueue("resize", job, conn=conn)


async def main() -> None:
    app.connections.resolve()
    async with await psycopg.AsyncConnection.connect(app.settings.database_url) as conn:
        kept = await place_order(conn, "order-1")
        await conn.commit()
        dropped = await place_order(conn, "order-2")
        await conn.rollback()
    plain = await app.aenqueue("resize", Resize(url="/a.png", width=10))  # its own transaction
    try:
        await app.aget_job(dropped)
    except JobNotFound:
        state = (await app.aget_job(kept)).state
        print(f"committed {kept}: {state}; rolled back {dropped}: not found; plain {plain}")
    await app.aclose()
    app.close()


if __name__ == "__main__":
    asyncio.run(main())
