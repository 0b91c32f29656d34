"""Apply the packaged migrations in order, one transaction each, under an advisory lock.

Never edits a shipped migration: a schema change is a new numbered file.
"""

from __future__ import annotations

import importlib.resources
from typing import Any

import psycopg

from hivejobs.errors import SchemaMissing, SchemaOutdated
from hivejobs.store.sql import Steps, load_queries, run_plan

SCHEMA = load_queries("schema.sql")
_LOCK_KEY = 0x48495645  # "HIVE": serialises concurrent `hivejobs migrate` runs.


def migration_files() -> list[tuple[int, str, str]]:
    """(version, file name, sql) for every packaged migration, in order."""
    folder = importlib.resources.files("hivejobs.store") / "migrations"
    found = []
    for entry in folder.iterdir():
        if entry.name.endswith(".sql"):
            found.append((int(entry.name.split("_", 1)[0]), entry.name, entry.read_text()))
    return sorted(found)


def latest_version() -> int:
    return migration_files()[-1][0]


def apply_migrations(conn: psycopg.Connection[Any]) -> list[str]:
    """Apply what is pending; return the file names applied (empty when up to date).

    The lock is the migration transaction's own (pg_advisory_xact_lock): released by its
    commit or rollback, so behind a transaction-mode pooler it can never stay behind on a
    server connection that other clients get next. Each transaction re-reads the version
    under the lock, so concurrent migrates apply each file once."""
    conn.autocommit = True
    applied: list[str] = []
    files = migration_files()
    while True:
        with conn.transaction():
            conn.execute(SCHEMA["migration_lock"], {"key": _LOCK_KEY})
            conn.execute(SCHEMA["create_version_table"])
            rows = conn.execute(SCHEMA["applied_versions"]).fetchall()
            done = {int(r[0]) for r in rows}
            # Every missing version, not only those above the highest: files written on
            # branches at the same time may land with numbers below one already applied.
            pending = [(v, name, sql) for v, name, sql in files if v not in done]
            if not pending:
                return applied
            version, name, sql = pending[0]
            conn.execute(sql.encode())
            conn.execute(SCHEMA["record_version"], {"version": version, "name": name})
        applied.append(name)


def check_schema(conn: psycopg.Connection[Any]) -> None:
    """Raise a clear error telling the user to migrate when the schema is missing or old."""
    run_plan(conn, schema_check_plan())


def schema_check_plan() -> Steps[None]:
    """The schema check as statements, so that the async client runs the same check."""
    row = yield SCHEMA["version_table_exists"], {}
    if not row or not row[0]:
        raise SchemaMissing()
    found = yield SCHEMA["applied_version_array"], {}
    done = set(found[0] or []) if found else set()
    missing = [v for v, _, _ in migration_files() if v not in done]
    if missing:
        raise SchemaOutdated(max(done, default=0), latest_version())
