"""Enqueue statements as plans that a sync or an async connection runs alike.

An enqueue may run on the store's own pool (sync or async) or on a caller's connection, in
the caller's transaction. The statements and the decisions between them (insert, then look
for a finished job with the same id) are written once, here, as generators: a plan yields
(sql, params) and receives the first row of each statement. `run_plan` and `arun_plan` are
the only I/O. This module never commits, rolls back or closes a caller's connection: a
caller's transaction is entered with a savepoint of its own (`caller_savepoint`), so a
failing statement leaves the caller's transaction usable, and only the caller's COMMIT makes
the job visible and, through NOTIFY, dispatched.

The dispatch NOTIFY payload is built and parsed in store/notify.py alone.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator, Sequence
from datetime import datetime, timedelta
from typing import Any

import msgspec
import psycopg
from psycopg.pq import TransactionStatus

from hivejobs.errors import InvalidArgument
from hivejobs.records.dispatch import Push
from hivejobs.records.jobs import Inserted, NewJob, UniqueClaim
from hivejobs.store.debounce import debounce_plan
from hivejobs.store.notify import dispatch_payloads
from hivejobs.store.sequence import sequenced_insert
from hivejobs.store.sql import Steps, load_queries

QUERIES = load_queries("jobs.sql")
NOTIFY = load_queries("notify.sql")
COPY_JOBS = QUERIES["copy_jobs"]
COPY_TYPES = [
    "text", "text", "text", "int2", "int4", "text", "bytea", "timestamptz", "timestamptz",
    "timestamptz", "text",
]  # fmt: skip


# -- plans ---------------------------------------------------------------------------------


def insert_plan(job: NewJob, explicit_id: bool) -> Steps[Inserted]:
    """Insert unless the id exists; `created` tells which.

    A generated id cannot exist yet, so it costs one statement. A caller's id may name a
    finished job: that counts as existing (a finished job is never re-run by re-enqueueing
    its id). The archive check runs after the insert, in a new snapshot, so a completion
    that moved the id to the archive meanwhile is seen.
    """
    params = insert_params(job)
    row = yield sequenced_insert(job, params) or (QUERIES["insert_job"], params)
    if row is not None and not explicit_id:
        return Inserted(row[0], row[1], row[2], row[3], job.payload, True)
    if row is not None:
        archived = yield QUERIES["archived_exists"], {"id": job.id}
        if archived is None:
            return Inserted(row[0], row[1], row[2], row[3], job.payload, True)
        yield QUERIES["delete_live"], {"id": job.id}
        return Inserted(job.id, archived[0], "archived", job.priority, bytes(archived[1]), False)
    existing = yield QUERIES["find_existing"], {"id": job.id}
    if existing is None:  # finished and pruned between the two statements
        return Inserted(job.id, job.name, "gone", job.priority, b"", False)
    return Inserted(job.id, existing[0], existing[2], job.priority, bytes(existing[1]), False)


def enqueue_plan(job: NewJob, explicit_id: bool, in_caller: bool) -> Steps[Inserted]:
    """The unique window (if any), the insert, and in the caller's transaction the NOTIFY
    that dispatches it on commit (on the store's own connection the caller pushes instead).

    A duplicate in a unique window comes back as `state="duplicate"` with the id of the job
    that holds the key. A debounced or coalesced one (store/debounce.py) comes back as the
    key's job, with `created` telling whether it became queued here and must be dispatched."""
    if job.debounce is not None:
        joined = yield from debounce_plan(job, job.debounce)
        if joined is None:  # a new window: this job, waiting `within` (max_wait >= within)
            window = msgspec.structs.replace(job, delay_s=job.debounce.within_s, run_at=None)
            return (yield from insert_plan(window, False))  # a fresh uuid: no conflict
        if in_caller and joined.created and joined.state == "queued":
            yield from notify_plan([Push(joined.id, joined.name, joined.priority)])
        return joined
    if job.unique is not None:
        owner_id = yield from unique_plan(job, job.unique)
        if owner_id is not None:
            return Inserted(owner_id, job.name, "duplicate", job.priority, b"", False)
    inserted = yield from insert_plan(job, explicit_id)
    if in_caller and inserted.created and inserted.state == "queued":
        yield from notify_plan([Push(job.id, job.name, job.priority)])
    return inserted


def unique_plan(job: NewJob, unique: UniqueClaim) -> Steps[str | None]:
    """Take the job's unique key; None when taken, else the id of the job that holds it."""
    params = {"key": unique.key, "id": job.id, "window_s": unique.window_s}
    if (yield QUERIES["take_unique_key"], params) is not None:
        return None
    owner = yield QUERIES["unique_owner"], {"key": unique.key}
    if owner is not None and owner[1] in unique.states:
        return str(owner[0])
    # The holder ended outside the covered states (or was pruned): the key is free.
    if owner is not None:
        taken = yield QUERIES["take_over_unique_key"], {**params, "owner": owner[0]}
        if taken is not None:
            return None
    again = yield QUERIES["unique_owner"], {"key": unique.key}
    if again is None:  # its window passed and the row was pruned meanwhile: start over
        return (yield from unique_plan(job, unique))
    return str(again[0])


def notify_plan(pushes: Sequence[Push]) -> Steps[None]:
    """Inside the caller's transaction: the coordinator hears of these ids only on commit."""
    payloads = dispatch_payloads(pushes)
    if payloads:
        yield NOTIFY["notify_dispatch"], {"payloads": payloads}


def get_plan(job_id: str) -> Steps[dict[str, Any] | None]:
    """A job's row, live or archived, as a dict of the get_live / get_archived columns."""
    row = yield QUERIES["get_live"], {"id": job_id}
    if row is None:
        row = yield QUERIES["get_archived"], {"id": job_id}
    if row is None:
        return None
    return dict(zip(JOB_COLUMNS, row, strict=True))


JOB_COLUMNS = (
    "id", "name", "state", "attempt", "attempts", "priority", "delivery", "payload",
    "created_at", "run_at", "started_at", "finished_at", "expires_at", "error", "result",
)  # fmt: skip


def insert_params(job: NewJob) -> dict[str, Any]:
    return {
        "id": job.id,
        "name": job.name,
        "priority": job.priority,
        "attempts": job.attempts,
        "delivery": job.delivery,
        "payload": job.payload,
        "run_at": job.run_at,
        "delay_s": job.delay_s,
        "expires_at": job.expires_at,
        "trace_context": job.trace_context,
    }


def copy_rows(jobs: Sequence[NewJob], now: datetime) -> Iterator[tuple[Any, ...]]:
    """COPY rows for fresh jobs; `now` is the database clock read in the same transaction."""
    for job in jobs:
        run_at = _run_at(job, now)
        waiting = run_at > now
        yield (
            job.id,
            job.name,
            "scheduled" if waiting else "queued",
            job.priority,
            job.attempts,
            job.delivery,
            job.payload,
            run_at,
            None if waiting else now,
            job.expires_at,
            job.trace_context,
        )


def queued_pushes(jobs: Sequence[NewJob], now: datetime) -> list[Push]:
    """The jobs of a COPY that start queued (not scheduled for later): their ids go out."""
    return [Push(j.id, j.name, j.priority) for j in jobs if _run_at(j, now) <= now]


def _run_at(job: NewJob, now: datetime) -> datetime:
    return job.run_at or now + timedelta(seconds=job.delay_s or 0.0)


# -- the caller's transaction --------------------------------------------------------------


def owns_transaction(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """True when an enqueue on `conn` is its own transaction: an autocommit connection with
    no transaction block open. Anything else belongs to the caller, who commits or not."""
    status = conn.info.transaction_status
    if status == TransactionStatus.INERROR:
        raise InvalidArgument(
            "the connection's transaction has failed (an earlier statement raised): "
            "roll it back before enqueueing"
        )
    if status not in (TransactionStatus.IDLE, TransactionStatus.INTRANS):
        raise InvalidArgument(f"the connection cannot run a statement now ({status.name})")
    return bool(conn.autocommit) and status == TransactionStatus.IDLE


@contextlib.contextmanager
def caller_savepoint(conn: psycopg.Connection[Any]) -> Iterator[None]:
    """Statements in the caller's transaction, undone alone if one fails.

    Not `conn.transaction()`: on a connection with no transaction under way psycopg would
    BEGIN and then COMMIT on the caller's behalf. A SAVEPOINT instead makes psycopg open the
    caller's implicit transaction (non-autocommit) and leaves its end to the caller.
    """
    conn.execute(QUERIES["savepoint_enqueue"])
    try:
        yield
    except BaseException:
        with contextlib.suppress(psycopg.Error):  # the connection itself may be gone
            conn.execute(QUERIES["rollback_to_enqueue"])
            conn.execute(QUERIES["release_enqueue"])
        raise
    conn.execute(QUERIES["release_enqueue"])


@contextlib.asynccontextmanager
async def acaller_savepoint(conn: psycopg.AsyncConnection[Any]) -> AsyncIterator[None]:
    """`caller_savepoint` for an async connection."""
    await conn.execute(QUERIES["savepoint_enqueue"])
    try:
        yield
    except BaseException:
        with contextlib.suppress(psycopg.Error):
            await conn.execute(QUERIES["rollback_to_enqueue"])
            await conn.execute(QUERIES["release_enqueue"])
        raise
    await conn.execute(QUERIES["release_enqueue"])
