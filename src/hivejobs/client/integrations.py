"""The caller's connection, whatever holds it: psycopg, SQLAlchemy 2 or Django.

`enqueue(conn=...)` works on the psycopg 3 connection underneath the caller's object, inside
the caller's transaction. SQLAlchemy and Django are optional: they are imported only when
the caller hands one of their objects in, so importing hivejobs never imports them.

For SQLAlchemy the transaction is begun the way SQLAlchemy itself would begin it on the
first statement (autobegin): otherwise psycopg would open a transaction that SQLAlchemy
does not know of, its `commit()` would do nothing and the job would be rolled back when the
connection goes back to its pool.
"""

from __future__ import annotations

from typing import Any, TypeVar

import psycopg

from hivejobs.errors import InvalidArgument

Conn = psycopg.Connection[Any]
AsyncConn = psycopg.AsyncConnection[Any]
C = TypeVar("C")

_SYNC_KINDS = "a psycopg Connection, a SQLAlchemy Connection or Session, or Django's connection"
_ASYNC_KINDS = "a psycopg AsyncConnection, or a SQLAlchemy AsyncConnection or AsyncSession"


def driver_connection(conn: object) -> Conn:
    """The psycopg connection behind `conn`, with its owner's transaction begun."""
    if isinstance(conn, psycopg.Connection):
        return conn
    if isinstance(conn, psycopg.AsyncConnection):
        raise InvalidArgument("conn is an async connection: use `await app.aenqueue(...)`")
    module = type(conn).__module__
    if module.startswith("sqlalchemy."):
        return _sqlalchemy_connection(conn)
    if module.startswith("django."):
        return _django_connection(conn)
    raise InvalidArgument(f"conn must be {_SYNC_KINDS}, not {type(conn).__name__}")


async def adriver_connection(conn: object) -> AsyncConn:
    """The psycopg async connection behind `conn`, with its owner's transaction begun."""
    if isinstance(conn, psycopg.AsyncConnection):
        return conn
    if isinstance(conn, psycopg.Connection):
        raise InvalidArgument("conn is a sync connection: use `app.enqueue(...)`")
    if type(conn).__module__.startswith("sqlalchemy."):
        from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

        if isinstance(conn, AsyncSession):
            conn = await conn.connection()
        if isinstance(conn, AsyncConnection):
            _check_sqlalchemy_driver(conn.dialect.driver)
            if not conn.in_transaction():
                await conn.begin()
            raw = await conn.get_raw_connection()
            return _checked(raw.driver_connection, psycopg.AsyncConnection, _ASYNC_KINDS)
    raise InvalidArgument(f"conn must be {_ASYNC_KINDS}, not {type(conn).__name__}")


def _sqlalchemy_connection(conn: object) -> Conn:
    from sqlalchemy.engine import Connection
    from sqlalchemy.orm import Session

    if isinstance(conn, Session):
        conn = conn.connection()
    if not isinstance(conn, Connection):
        raise InvalidArgument(f"conn must be {_SYNC_KINDS}, not {type(conn).__name__}")
    _check_sqlalchemy_driver(conn.dialect.driver)
    if not conn.in_transaction():
        conn.begin()
    return _checked(conn.connection.driver_connection, psycopg.Connection, _SYNC_KINDS)


def _check_sqlalchemy_driver(driver: str) -> None:
    if driver != "psycopg":
        raise InvalidArgument(
            f"the SQLAlchemy engine uses the {driver!r} driver; hivejobs needs psycopg 3: "
            "create it with a 'postgresql+psycopg://' URL"
        )


def _django_connection(conn: Any) -> Conn:
    """Django's `connection` (a proxy) or a connection wrapper of its postgresql backend."""
    if getattr(conn, "vendor", None) != "postgresql":
        raise InvalidArgument(f"conn must be {_SYNC_KINDS}, not {type(conn).__name__}")
    conn.ensure_connection()
    return _checked(conn.connection, psycopg.Connection, "Django's postgresql backend on psycopg 3")


def _checked(raw: object, kind: type[C], expected: str) -> C:
    if not isinstance(raw, kind):
        raise InvalidArgument(f"conn must be {expected}; its driver gave {type(raw).__name__}")
    return raw
