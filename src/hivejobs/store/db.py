"""The connection pool every store aggregate shares, and connecting with clear errors.

`Database` owns the pool and the session settings it was asked for; the aggregates
(jobs.py, workers.py, leases.py, maintenance.py) add statements over it and own nothing else.
Statements are in schema.sql. Never decides policy.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any, Self

import psycopg
import psycopg.sql
from psycopg_pool import ConnectionPool

from hivejobs.errors import ConfigError, ConnectionFailed
from hivejobs.store.migrate import apply_migrations, check_schema
from hivejobs.store.session_settings import (
    configure_for,
    connect_kwargs,
    local_settings_sql,
    pooler_refused,
    settings_not_in_force,
    with_local_settings,
)
from hivejobs.store.sql import load_queries
from hivejobs.urls import redact_url, scrub, url_secrets, warn_plaintext_postgres

Conn = psycopg.Connection[Any]
SCHEMA = load_queries("schema.sql")

_DATABASE_MISSING = re.compile(r'database "[^"]*" does not exist')
_ROLE_MISSING = re.compile(r'role "[^"]*" does not exist')


def connection_failed(url: str, exc: psycopg.Error) -> ConnectionFailed:
    """libpq's whole reason (every line: it tries each address), the URL redacted, and the
    advice that fits it."""
    # libpq's "Is the server running on that host...?" is the advice ConnectionFailed gives.
    lines = [
        line.strip().rstrip(".")
        for line in str(exc).splitlines()
        if line.strip() and not line.strip().startswith("Is the server running")
    ]
    reason = scrub("; ".join(lines) or type(exc).__name__, url_secrets(url))
    if _ROLE_MISSING.search(reason):
        advice = "the user name in the URL is wrong, or that role was never created"
        return ConnectionFailed("Postgres", redact_url(url), reason, advice)
    if _DATABASE_MISSING.search(reason):
        # The server runs: only the database is missing, which migrate creates.
        advice = "run `hivejobs migrate`, which creates it"
        return ConnectionFailed("Postgres", redact_url(url), reason, advice)
    return ConnectionFailed("Postgres", redact_url(url), reason)


def connect(url: str, pooled: bool = False, **kwargs: Any) -> Conn:
    """A plain autocommit connection, with a clear error when the server does not answer.
    `pooled`: through a transaction-mode pooler (no prepared statements)."""
    kwargs = {**connect_kwargs(pooled, None), **kwargs}
    try:
        return psycopg.connect(url, **kwargs)
    except psycopg.OperationalError as exc:
        refused = pooler_refused(scrub(str(exc), url_secrets(url)))
        if refused is not None:
            raise refused from None
        raise connection_failed(url, exc) from None


def create_database_if_missing(url: str) -> bool:
    """`hivejobs migrate` on a fresh server: create the database named in the URL.

    Only a "database does not exist" answer leads to CREATE DATABASE; a wrong role, password
    or host is reported as such."""
    info = psycopg.conninfo.conninfo_to_dict(url)
    dbname = str(info.get("dbname") or "")
    if not dbname:
        return False
    try:
        psycopg.connect(url, connect_timeout=5).close()
        return False
    except psycopg.OperationalError as exc:
        if not _DATABASE_MISSING.search(str(exc)):
            raise connection_failed(url, exc) from None
    maintenance = psycopg.conninfo.make_conninfo(url, dbname="postgres")
    with connect(maintenance) as conn:
        try:
            conn.execute(
                psycopg.sql.SQL(SCHEMA["create_database"]).format(
                    dbname=psycopg.sql.Identifier(dbname)
                )
            )
        except psycopg.errors.DuplicateDatabase:
            return False  # a concurrent creator won the race
        except psycopg.errors.InsufficientPrivilege:
            user = str(info.get("user") or "the URL's user")
            raise ConfigError(
                f"database {dbname!r} does not exist and role {user!r} may not create it: "
                "create it as a superuser (CREATE DATABASE ... OWNER ...) or grant CREATEDB, "
                "then run `hivejobs migrate` again"
            ) from None
    return True


class Database:
    """Owns one psycopg connection pool and the session settings its connections carry.

    Every aggregate of the store runs its statements on connections from here, so a process
    holds one pool, sized by its role, whatever it reads or writes. A synchronous() view
    shares the pool and differs only in `_commit_settings` (None here: the session's)."""

    def __init__(
        self,
        url: str,
        max_size: int = 4,
        min_size: int = 1,
        session: dict[str, str] | None = None,
        pooled: bool = False,
        synchronous_view: bool = False,
        role: str | None = None,
    ) -> None:
        """`session`: Postgres settings for every connection: sent at connect (no round trip)
        or, `pooled` (a transaction-mode pooler), set for each transaction the store opens and
        sent along with each statement outside one (store/session_settings.py). `synchronous_view`:
        synchronous() may be asked for (the connections can take local settings). `role`:
        the connections' application_name ("hivejobs pool resize"), so that
        pg_stat_activity says which process of a fleet holds each one (and `hivejobs
        bench` splits Postgres CPU by role); an application_name in the URL wins."""
        self.url = url
        self.pooled = pooled
        self.session = dict(session or {})
        self.synchronous_view = synchronous_view
        self._commit_settings: bytes | None = None
        kwargs = connect_kwargs(pooled, session)
        if role is not None and "application_name" not in psycopg.conninfo.conninfo_to_dict(url):
            kwargs["application_name"] = role
        warn_plaintext_postgres(url)
        connect(url, **kwargs).close()  # fail fast with a clear message
        connection_class, configure = configure_for(pooled, session, settable=synchronous_view)
        self._pool: ConnectionPool[Conn] = ConnectionPool(
            url,
            connection_class=connection_class,
            configure=configure,
            min_size=min_size,
            max_size=max_size,
            kwargs=kwargs,
            open=True,
            name="hivejobs",
            timeout=5.0,  # an outage fails calls in seconds instead of queueing them
            reconnect_timeout=3600.0,  # keep trying through long outages
        )

    def close(self) -> None:
        self._pool.close()

    @contextmanager
    def connection(self) -> Iterator[Conn]:
        with self._pool.connection() as conn:
            if self._commit_settings is None:
                yield conn
                return
            with with_local_settings(conn, self._commit_settings):
                yield conn

    def synchronous(self) -> Self:
        """This store on the same pool, every transaction it runs committing synchronously
        whatever the session says: `synchronous_commit=on` set locally, in the same round
        trip (store/session_settings.py). For the at-most-once lanes of a pool process whose other
        lanes commit asynchronously (worker/process.py). Closing either closes the pool."""
        if not self.synchronous_view:
            raise ValueError("synchronous() needs a store made with synchronous_view=True")
        settings = {**self.session} if self.pooled else {}
        settings["synchronous_commit"] = "on"
        view = copy.copy(self)
        view._commit_settings = local_settings_sql(settings)
        return view

    def migrate(self) -> list[str]:
        with self.connection() as conn:
            return apply_migrations(conn)

    def check_schema(self) -> None:
        with self.connection() as conn:
            check_schema(conn)

    def now(self) -> datetime:
        """The database clock, which every time in the schema is judged on."""
        with self.connection() as conn:
            return db_now(conn)

    def session_not_in_force(self) -> list[str]:
        """The session settings this store asked for that a transaction of its own does not
        have (`name=found, wanted value`); empty when all are in force."""
        if not self.session:
            return []
        with self.connection() as conn:
            return settings_not_in_force(conn, self.session)


def db_now(conn: Conn) -> datetime:
    row = conn.execute(SCHEMA["db_now"]).fetchone()
    assert row is not None  # SELECT now() returns one row
    now: datetime = row[0]
    return now
