"""Postgres, the store of truth: the only code that speaks SQL.

Every statement lives in a .sql file beside the module that runs it, one per aggregate:
jobs (jobs.py), workers (workers.py), the coordinator lease (leases.py), leader-only upkeep
(maintenance.py), chains (chains.py; the traverser's pass in traversal.py), callbacks,
schedules, listings, and LISTEN/NOTIFY (notify.py). Imports nothing of ours but records,
errors, config and the bottom helpers (serialization; display for a listed job's exception
line). Never decides policy (retries, delivery): callers pass outcomes, the store writes them
with the guards that keep them safe (state and claim-token fences, the lease for leader-only
writes).

Layer: beside broker/ (never imports it), under everything but the bottom modules.
"""

from __future__ import annotations

import psycopg

from hivejobs.store.db import (
    Conn,
    connect,
    connection_failed,
    create_database_if_missing,
)
from hivejobs.store.jobs import Jobs
from hivejobs.store.maintenance import Maintenance
from hivejobs.store.session_settings import PREPARED_PLANS
from hivejobs.store.sql import load_queries
from hivejobs.store.workers import Workers, new_worker_id

__all__ = [
    "PREPARED_PLANS",
    "QUERIES",
    "Conn",
    "Store",
    "connect",
    "connection_failed",
    "create_database_if_missing",
    "is_data_error",
    "new_worker_id",
]

# Every named statement of the core aggregates, for tests and benchmarks that EXPLAIN them.
QUERIES = {
    name: sql
    for file in ("jobs.sql", "workers.sql", "leases.sql", "maintenance.sql", "schema.sql")
    for name, sql in load_queries(file).items()
}


class Store(Jobs, Workers, Maintenance):
    """One connection pool (store/db.py) with the statements of every core aggregate.

    Each aggregate is a class of its own over its own .sql file (Jobs, Workers, Leases,
    Maintenance); Store only puts them on one pool, so that a process opens one pool and its
    callers keep one object. Chains, callbacks, schedules and listings are objects over a
    Store (ChainStore, TraversalStore, CallbackStore, ScheduleStore, DashboardStore)."""


def is_data_error(exc: BaseException) -> bool:
    """True when a write failed because of what it writes, so that retrying the same rows
    fails again: a constraint, a value Postgres refuses, or one that cannot even be sent
    (a non-psycopg error raised while adapting parameters, e.g. UnicodeEncodeError).
    False for the server or the connection (lost, shut down, read-only after a failover,
    lock or serialization conflicts): those pass, so the write is retried."""
    if not isinstance(exc, psycopg.Error):
        return isinstance(exc, Exception)
    if isinstance(exc, psycopg.errors.ProgramLimitExceeded):
        return True  # a value too big for Postgres (class 54)
    return isinstance(
        exc,
        (
            psycopg.DataError,
            psycopg.IntegrityError,
            psycopg.ProgrammingError,
            psycopg.NotSupportedError,
        ),
    )
