"""Session settings that work the same direct and behind a transaction-mode pooler
(PgBouncer), and the connections that carry them.

A transaction-mode pooler hands each transaction to whichever server connection is free:
it refuses startup `options`, a session `SET` would reach another client's transactions,
and psycopg's automatic prepared statements would be looked up on a connection that never
prepared them. So, `pooled`: no startup options, no prepared statements, and the session
settings a store wants are set with `set_config(..., is_local => true)` right after BEGIN of
every transaction it opens, and pipelined ahead of each statement run outside one (the two
share one implicit transaction, one round trip). Direct, they go as startup options.

The same per-transaction mechanism, direct or pooled, lets one lane of a pool process commit
synchronously on connections whose session commits asynchronously (Database.synchronous,
worker/process.py): its settings are `with_local_settings` around its own use of a connection.

Never changes a setting outside a transaction, and never touches a caller's connection.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Self, cast

import psycopg
import psycopg.sql
from psycopg import Transaction
from psycopg.abc import Params, Query
from psycopg.pq import TransactionStatus
from psycopg.rows import Row

from hivejobs.errors import ConfigError
from hivejobs.store.sql import load_queries

SCHEMA = load_queries("schema.sql")


class LocalSettingsCursor(psycopg.Cursor[Row]):
    """Outside a transaction, sends the settings with each statement, so that they are in
    force for it as they would be in a direct session: the coordinator's lock_timeout on
    a lease attempt, the pool's synchronous_commit on a claim."""

    def execute(
        self,
        query: Query,
        params: Params | None = None,
        *,
        prepare: bool | None = None,
        binary: bool | None = None,
    ) -> Self:
        # Forwarded as received: psycopg's own overloads already checked the arguments.
        run = cast(Callable[..., Self], super().execute)
        conn = self.connection
        if (
            isinstance(conn, LocalSettingsConnection)
            and conn.local_settings
            and conn.autocommit
            and conn.info.transaction_status == TransactionStatus.IDLE
        ):
            # One flight, one implicit transaction: in a pipeline, statements up to the Sync
            # share it, so set_config(..., is_local) holds for the statement and ends with
            # it (BEGIN and COMMIT would be two more round trips). Results are read after.
            with conn.pipeline():
                psycopg.Cursor(conn).execute(conn.local_settings)
                run(query, params, prepare=prepare, binary=binary)
            return self
        return run(query, params, prepare=prepare, binary=binary)


class LocalSettingsConnection(psycopg.Connection[Any]):
    """A connection whose outermost transactions start with `local_settings` (a SELECT of
    set_config calls, or empty), and whose statements outside a transaction each run in
    one (LocalSettingsCursor). Owned by one pool: set by the pool's configure, and changed
    only by the holder of the connection, for as long as it holds it (with_local_settings)."""

    local_settings: bytes = b""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cursor_factory = LocalSettingsCursor

    @contextmanager
    def transaction(
        self, savepoint_name: str | None = None, force_rollback: bool = False
    ) -> Iterator[Transaction]:
        outer = self.info.transaction_status == TransactionStatus.IDLE
        with super().transaction(savepoint_name, force_rollback) as tx:
            if outer and self.local_settings:
                psycopg.Cursor(self).execute(self.local_settings)
            yield tx


@contextmanager
def with_local_settings(conn: psycopg.Connection[Any], statement: bytes) -> Iterator[None]:
    """`conn`'s transactions and statements carry `statement` (local_settings_sql) instead of
    its own for the block; held by the caller, so no one else sees the change."""
    if not isinstance(conn, LocalSettingsConnection):
        raise TypeError("local settings need a LocalSettingsConnection (see configure_for)")
    before = conn.local_settings
    conn.local_settings = statement
    try:
        yield
    finally:
        conn.local_settings = before


def local_settings_sql(session: Mapping[str, str]) -> bytes:
    """One statement setting every name for the current transaction only."""
    calls = psycopg.sql.SQL(", ").join(
        psycopg.sql.SQL("set_config({}, {}, true)").format(
            psycopg.sql.Literal(name), psycopg.sql.Literal(value)
        )
        for name, value in session.items()
    )
    return psycopg.sql.SQL("SELECT {}").format(calls).as_string(None).encode()


# The session settings of the processes that run the hot statements, pools and coordinator,
# when they connect directly (they prepare their statements). psycopg prepares a statement at
# its fifth run, and Postgres keeps the plan it makes then for the session's life: only an
# ANALYZE or a DDL of the table plans it again, and with autovacuum off none comes. A plan made
# while the hot table held a few rows (a process that started on a quiet queue) is a
# sequential scan, which a backlog then turns into a read of the whole queue at every claim
# and completion (33 ms for 10 completions with 200,000 jobs queued, against 0.5). Each hot
# statement has an index that serves it; with sequential scans off the planner takes it
# whatever the table's size when the plan is made (tests/integration/test_plan_stability.py).
# A table no index serves is still read in full, at a cost of 10^10 more: past jit_above_cost,
# so JIT is off too (it compiled the pruner's delete at every call: 350 ms, not 1).
# Not for the sessions of enqueuers, the CLI and the dashboard: their counts read whole
# tables, which a parallel sequential scan does best. Behind a pooler nothing is prepared.
PREPARED_PLANS = {"enable_seqscan": "off", "jit": "off"}


def connect_kwargs(pooled: bool, session: Mapping[str, str] | None) -> dict[str, Any]:
    """psycopg connect arguments: autocommit, a connect timeout; direct, the session as
    startup options; pooled, no prepared statements (they live on one server connection)."""
    kwargs: dict[str, Any] = {"autocommit": True, "connect_timeout": 5}
    if pooled:
        kwargs["prepare_threshold"] = None
    elif session:
        kwargs["options"] = " ".join(f"-c {k}={v}" for k, v in session.items())
    return kwargs


def configure_for(
    pooled: bool, session: Mapping[str, str] | None, settable: bool = False
) -> tuple[type[psycopg.Connection[Any]], Any]:
    """(connection class, configure callback) for a pool with these settings; `settable`:
    its holders may change the local settings (with_local_settings), even direct."""
    if not (pooled and session) and not settable:
        return psycopg.Connection, None
    statement = local_settings_sql(session) if pooled and session else b""

    def configure(conn: psycopg.Connection[Any]) -> None:
        if isinstance(conn, LocalSettingsConnection):
            conn.local_settings = statement

    return LocalSettingsConnection, configure


def settings_not_in_force(conn: psycopg.Connection[Any], wanted: Mapping[str, str]) -> list[str]:
    """Inside one of the store's transactions, the wanted settings that Postgres does not
    have (as `name=found, wanted value`): empty when every one is in force."""
    missing: list[str] = []
    with conn.transaction():
        rows = conn.execute(SCHEMA["settings_in_force"], {"names": list(wanted)}).fetchall()
    found = {str(r[0]): str(r[1]) for r in rows}
    for name, value in wanted.items():
        if found.get(name) != value:
            missing.append(f"{name}={found.get(name)!r}, wanted {value!r}")
    return missing


def pooler_refused(reason: str) -> ConfigError | None:
    """A pooler's refusal of startup options, turned into what to do about it."""
    if "unsupported startup parameter" not in reason:
        return None
    return ConfigError(
        f"the server refused a startup parameter ({reason.strip()}): this is a connection "
        "pooler (PgBouncer); set HIVEJOBS_PGBOUNCER=1 (see docs/scaling.md)"
    )
