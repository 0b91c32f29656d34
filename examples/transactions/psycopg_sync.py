"""Enqueue in a psycopg transaction: the job exists, and runs, only if the caller commits.

python -m examples.transactions.psycopg_sync      # with `hivejobs run examples.myapp:app`
"""

from __future__ import annotations

import psycopg

from examples.myapp import Resize, app
from hivejobs import JobNotFound


def place_order(conn: psycopg.Connection[tuple[object, ...]], order_id: str) -> str:
    """The order row and its job commit together, or neither does."""
    conn.execute("CREATE TEMP TABLE IF NOT EXISTS example_order (id text PRIMARY KEY)")
    conn.execute("INSERT INTO example_order VALUES (%s)", (order_id,))
    return app.enqueue("resize", Resize(url=f"/orders/{order_id}.png", width=200), conn=conn)


def main() -> None:
    app.connections.resolve()
    with psycopg.connect(app.settings.database_url) as conn:  # not autocommit: psycopg's default
        kept = place_order(conn, "order-1")
        conn.commit()
        dropped = place_order(conn, "order-2")
        conn.rollback()  # the request failed: no order, no job
    try:
        app.get_job(dropped)
    except JobNotFound:
        print(f"committed {kept}: {app.get_job(kept).state}; rolled back {dropped}: not found")
    app.close()


if __name__ == "__main__":
    main()
