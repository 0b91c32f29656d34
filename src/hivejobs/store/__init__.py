"""Postgres, the store of truth: the only code that speaks SQL.

Every statement lives in queries.sql. Imports nothing of ours but records, errors and config.
Never decides policy (retries, delivery): callers pass outcomes, this module writes them with
the guards that keep them safe (state and claim-token fences).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from datetime import datetime
from typing import Any

import psycopg
import psycopg.sql
from psycopg.rows import class_row
from psycopg_pool import ConnectionPool

from hivejobs.config import redact_url, scrub, url_secrets
from hivejobs.errors import ConfigError, ConnectionFailed
from hivejobs.records import (
    ClaimedJob,
    Completion,
    Inserted,
    JobTypeInfo,
    NewJob,
    Rescued,
    TypeCounts,
    WorkerInfo,
)
from hivejobs.store.callbacks import await_callbacks, cancel_awaiting_callback
from hivejobs.store.chains import suspend_chain_tries
from hivejobs.store.enqueue import (
    COPY_JOBS,
    COPY_TYPES,
    Push,
    caller_savepoint,
    copy_rows,
    enqueue_plan,
    get_plan,
    insert_plan,
    notify_plan,
    owns_transaction,
    queued_pushes,
    run_plan,
)
from hivejobs.store.migrate import apply_migrations, check_schema
from hivejobs.store.pooling import (
    configure_for,
    connect_kwargs,
    pooler_refused,
    settings_not_in_force,
)
from hivejobs.store.sql import load_queries

Conn = psycopg.Connection[Any]


QUERIES = load_queries("queries.sql")


_DATABASE_MISSING = re.compile(r'database "[^"]*" does not exist')
_ROLE_MISSING = re.compile(r'role "[^"]*" does not exist')


def connection_failed(url: str, exc: psycopg.Error) -> ConnectionFailed:
    """libpq's whole reason (every line: it tries each address), the URL redacted."""
    reason = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    reason = scrub(reason or type(exc).__name__, url_secrets(url))
    if _ROLE_MISSING.search(reason):
        reason += " (the user name in the URL is wrong, or that role was never created)"
    elif _DATABASE_MISSING.search(reason):
        reason += " (run `hivejobs migrate`, which creates it)"
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
                psycopg.sql.SQL("CREATE DATABASE {}").format(psycopg.sql.Identifier(dbname))
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


class Store:
    """A connection pool plus one method per statement."""

    def __init__(
        self,
        url: str,
        max_size: int = 4,
        min_size: int = 1,
        session: dict[str, str] | None = None,
        pooled: bool = False,
    ) -> None:
        """`session`: Postgres settings for every connection: sent at connect (no round trip)
        or, `pooled` (a transaction-mode pooler), set for each transaction the store opens and
        sent along with each statement outside one (store/pooling.py)."""
        self.url = url
        self.pooled = pooled
        self.session = dict(session or {})
        kwargs = connect_kwargs(pooled, session)
        connect(url, **kwargs).close()  # fail fast with a clear message
        connection_class, configure = configure_for(pooled, session)
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
            yield conn

    # -- schema ------------------------------------------------------------------------

    def migrate(self) -> list[str]:
        with self.connection() as conn:
            return apply_migrations(conn)

    def check_schema(self) -> None:
        with self.connection() as conn:
            check_schema(conn)

    def now(self) -> datetime:
        with self.connection() as conn:
            return conn.execute(QUERIES["db_now"]).fetchone()[0]  # type: ignore[index,no-any-return]

    # -- enqueue -----------------------------------------------------------------------

    def insert_job(self, job: NewJob, explicit_id: bool, conn: Conn | None = None) -> Inserted:
        """Insert unless the id exists (see enqueue.insert_plan); in `conn`'s transaction if
        given, where a queued job is dispatched by NOTIFY when (and only if) the caller
        commits. Otherwise the caller pushes the id to Redis."""
        if conn is None:
            with self.connection() as own:
                return _insert_own(own, job, explicit_id)
        if owns_transaction(conn):
            return _insert_own(conn, job, explicit_id)
        # A generated id is one INSERT; a caller's id or a unique window may take several
        # statements, undone together if one fails so that the caller's transaction stays
        # usable.
        single = not explicit_id and job.unique is None
        with nullcontext() if single else caller_savepoint(conn):
            return run_plan(conn, enqueue_plan(job, explicit_id, in_caller=True))

    def insert_many(self, jobs: Sequence[NewJob], conn: Conn | None = None) -> list[Push]:
        """COPY fresh jobs (generated ids, so no conflicts) in one transaction: the store's
        own, or `conn`'s. Returns the pushes for the caller to make; none in the caller's
        transaction, whose commit dispatches them (NOTIFY)."""
        with nullcontext(conn) if conn is not None else self.connection() as c:
            in_caller = conn is not None and not owns_transaction(c)
            with nullcontext() if in_caller else c.transaction():
                now: datetime = c.execute(QUERIES["db_now"]).fetchone()[0]  # type: ignore[index]
                with c.cursor().copy(COPY_JOBS) as copy:
                    copy.set_types(COPY_TYPES)
                    for row in copy_rows(jobs, now):
                        copy.write_row(row)
                pushes = queued_pushes(jobs, now)
                if not in_caller:
                    return pushes
                run_plan(c, notify_plan(pushes))
                return []

    # -- claim and finish --------------------------------------------------------------

    def claim_queued(
        self, ids: list[str], worker_id: str, conn: Conn, *, name: str
    ) -> list[ClaimedJob]:
        """Claim by primary key: Postgres never scans a queue under contention. Only jobs of
        type `name`: a pool never runs a job under another type's handler."""
        cur = conn.cursor(row_factory=class_row(ClaimedJob))
        params = {"ids": ids, "worker_id": worker_id, "name": name}
        return cur.execute(QUERIES["claim_queued"], params).fetchall()

    def foreign_ids(self, ids: list[str], name: str) -> list[tuple[str, str]]:
        """(id, type) of those ids that are live jobs of a type other than `name`."""
        with self.connection() as conn:
            rows = conn.execute(QUERIES["foreign_ids"], {"ids": ids, "name": name}).fetchall()
        return [(r[0], r[1]) for r in rows]

    def drop_archived_duplicate_if_running(self, job_id: str, claim_token: int) -> bool:
        """Remove our claim's live row if its id is already archived; True if it was."""
        with self.connection() as conn:
            params = {"id": job_id, "token": claim_token}
            return bool(
                conn.execute(QUERIES["drop_archived_duplicate_if_running"], params).fetchall()
            )

    def finish(self, done: Sequence[Completion], conn: Conn) -> tuple[int, list[tuple[Any, ...]]]:
        """Write one batch of finished claims in one transaction (group commit).

        Returns how many rows the fences let through, and the (id, name, priority, state) of
        jobs put back in the queue, whose ids the caller pushes to Redis.
        """
        archive = [c for c in done if c.outcome in ("succeeded", "failed", "cancelled")]
        requeue = [c for c in done if c.outcome in ("retry", "suspend")]
        suspends = [c for c in requeue if c.outcome == "suspend"]
        awaiting = [c for c in done if c.outcome == "await_callback"]
        written = 0
        requeued: list[tuple[Any, ...]] = []
        # One statement is atomic on its own: in autocommit it costs one round trip instead
        # of three (BEGIN, statement, COMMIT), which is every batch at low rates.
        single = not (archive and requeue) and not suspends and not awaiting
        with nullcontext() if single else conn.transaction():
            if awaiting:
                written += await_callbacks(conn, awaiting)
            if archive:
                rows = conn.execute(
                    QUERIES["archive_finished_if_running"],
                    {
                        "ids": [c.id for c in archive],
                        "tokens": [c.claim_token for c in archive],
                        "states": [c.outcome for c in archive],
                        "errors": [_text(c.error) for c in archive],
                        "results": [c.result for c in archive],
                    },
                ).fetchall()
                written += len(rows)
            if requeue:
                if suspends:
                    # Chain tries end here (their chain is suspended); plain jobs requeue.
                    written += suspend_chain_tries(conn, suspends)
                requeued = conn.execute(
                    QUERIES["requeue_if_running"],
                    {
                        "ids": [c.id for c in requeue],
                        "tokens": [c.claim_token for c in requeue],
                        "delays": [c.retry_delay_s for c in requeue],
                        "uncounts": [1 if c.outcome == "suspend" else 0 for c in requeue],
                        "errors": [_text(c.error) for c in requeue],
                    },
                ).fetchall()
                written += len(requeued)
        return written, requeued

    def rescue_workers(
        self, worker_ids: list[str], poison_after: int, lease: tuple[str, int] | None = None
    ) -> Rescued | None:
        """Release the claims of dead processes: requeue (attempt counted) or fail.

        With `lease` (holder, term) the write happens only while that term holds (R7);
        None when it does not.
        """
        params = {"worker_ids": worker_ids, "poison_after": poison_after}
        with self.connection() as conn, conn.transaction():
            if lease is not None and not self._hold_lease(conn, lease):
                return None
            duplicates = conn.execute(QUERIES["rescue_drop_archived_duplicates"], params)
            dropped = [r[0] for r in duplicates.fetchall()]
            requeued = conn.execute(QUERIES["rescue_requeue"], params).fetchall()
            failed = conn.execute(QUERIES["rescue_fail"], params).fetchall()
            conn.execute(QUERIES["delete_workers"], {"worker_ids": worker_ids})
        return Rescued(
            requeued=[(r[0], r[1], r[2]) for r in requeued],
            failed=len(failed),
            archived_duplicates=dropped,
        )

    def release_unstarted(self, ids: list[str], worker_id: str) -> list[tuple[Any, ...]]:
        with self.connection() as conn:
            return conn.execute(
                QUERIES["release_unstarted_if_mine"], {"ids": ids, "worker_id": worker_id}
            ).fetchall()

    def running_claims(self, worker_id: str) -> list[tuple[str, int]]:
        with self.connection() as conn:
            rows = conn.execute(QUERIES["running_claims"], {"worker_id": worker_id}).fetchall()
        return [(r[0], int(r[1])) for r in rows]

    def release_claims(self, claims: list[tuple[str, int]]) -> list[tuple[Any, ...]]:
        with self.connection() as conn:
            return conn.execute(
                QUERIES["release_claims_if_running"],
                {"ids": [c[0] for c in claims], "tokens": [c[1] for c in claims]},
            ).fetchall()

    # -- reads and user actions ----------------------------------------------------------

    def get_row(self, job_id: str) -> dict[str, Any] | None:
        with self.connection() as conn:
            return run_plan(conn, get_plan(job_id))

    def cancel(self, job_id: str) -> str | None:
        """'cancelled', 'requested' (it runs: its pool is told), or None (not live)."""
        with self.connection() as conn, conn.transaction():
            if conn.execute(QUERIES["cancel_waiting"], {"id": job_id}).fetchone():
                return "cancelled"
            if cancel_awaiting_callback(conn, job_id):
                return "cancelled"  # no process runs it: nobody to tell
            if conn.execute(QUERIES["request_cancel_running"], {"id": job_id}).fetchone():
                return "requested"
        return None

    def upsert_job_types(self, types: Sequence[JobTypeInfo]) -> None:
        with self.connection() as conn, conn.transaction():
            for t in types:
                conn.execute(
                    QUERIES["upsert_job_type"],
                    {
                        "name": t.name,
                        "concurrency": t.concurrency,
                        "processes": t.processes,
                        "attempts": t.attempts,
                        "delivery": t.delivery,
                        "timeout_s": t.timeout_s,
                        "callback": t.callback,
                        "callback_timeout_s": t.callback_timeout_s,
                    },
                )

    def job_types(self) -> list[JobTypeInfo]:
        with self.connection() as conn:
            cur = conn.cursor(row_factory=class_row(JobTypeInfo))
            return cur.execute(QUERIES["list_job_types"]).fetchall()

    def type_counts(self) -> list[TypeCounts]:
        with self.connection() as conn:
            cur = conn.cursor(row_factory=class_row(TypeCounts))
            return cur.execute(QUERIES["type_counts"]).fetchall()

    def queued_counts(self) -> dict[tuple[str, int], int]:
        with self.connection() as conn:
            rows = conn.execute(QUERIES["queued_counts"]).fetchall()
        return {(r[0], r[1]): r[2] for r in rows}

    def running_counts(self) -> dict[str, int]:
        with self.connection() as conn:
            return dict(conn.execute(QUERIES["running_counts"]).fetchall())

    # -- workers -----------------------------------------------------------------------

    def register_worker(
        self, worker_id: str, host: str, pid: int, role: str, pool: str | None
    ) -> None:
        with self.connection() as conn:
            conn.execute(
                QUERIES["register_worker"],
                {"id": worker_id, "host": host, "pid": pid, "role": role, "pool": pool},
            )

    def heartbeat(self, worker_id: str) -> bool:
        with self.connection() as conn:
            return conn.execute(QUERIES["heartbeat"], {"id": worker_id}).fetchone() is not None

    def deregister_worker(self, worker_id: str) -> None:
        with self.connection() as conn:
            conn.execute(QUERIES["deregister_worker"], {"id": worker_id})

    def workers(self) -> list[WorkerInfo]:
        with self.connection() as conn:
            cur = conn.cursor(row_factory=class_row(WorkerInfo))
            return cur.execute(QUERIES["list_workers"]).fetchall()

    def find_dead_workers(self, stuck_after_s: float) -> list[str]:
        with self.connection() as conn:
            rows = conn.execute(
                QUERIES["find_dead_workers"], {"stuck_after_s": stuck_after_s}
            ).fetchall()
        return [r[0] for r in rows]

    # -- coordinator -------------------------------------------------------------------

    def lease_acquire(self, holder: str, ttl_s: float) -> int | None:
        """The term when we hold the lease after this call, else None."""
        with self.connection() as conn:
            row = conn.execute(
                QUERIES["lease_acquire"], {"holder": holder, "ttl_s": ttl_s}
            ).fetchone()
        return None if row is None else int(row[0])

    def session_not_in_force(self) -> list[str]:
        """The session settings this store asked for that a transaction of its own does not
        have (`name=found, wanted value`); empty when all are in force."""
        if not self.session:
            return []
        with self.connection() as conn:
            return settings_not_in_force(conn, self.session)

    def lease_resign(self, holder: str) -> None:
        with self.connection() as conn:
            conn.execute(QUERIES["lease_resign"], {"holder": holder})
            conn.execute("NOTIFY hivejobs_leader")

    def lease_read(self) -> tuple[str | None, int, bool] | None:
        with self.connection() as conn:
            row = conn.execute(QUERIES["lease_read"]).fetchone()
        return None if row is None else (row[0], int(row[1]), bool(row[2]))

    def _hold_lease(self, conn: Conn, lease: tuple[str, int]) -> bool:
        params = {"holder": lease[0], "term": lease[1]}
        return conn.execute(QUERIES["lease_hold"], params).fetchone() is not None

    def leader_write(
        self, lease: tuple[str, int], query: str, params: dict[str, Any]
    ) -> list[tuple[Any, ...]] | None:
        """Run one coordinator statement only while `lease` holds; None when it does not."""
        with self.connection() as conn, conn.transaction():
            if not self._hold_lease(conn, lease):
                return None
            return conn.execute(QUERIES[query], params).fetchall()

    def running_of_workers(self, worker_ids: list[str]) -> list[tuple[str, str]]:
        """(id, type) of the jobs these workers run, longest-running first (at most 100)."""
        with self.connection() as conn:
            rows = conn.execute(QUERIES["running_of_workers"], {"worker_ids": worker_ids})
            return [(r[0], r[1]) for r in rows.fetchall()]

    def promote_due_unleased(self, limit: int) -> list[tuple[Any, ...]]:
        """promote_due without the coordinator's lease: for hivejobs.testing, where no
        coordinator runs. (id, name, priority) of the jobs now queued."""
        with self.connection() as conn:
            return conn.execute(QUERIES["promote_due"], {"limit": limit}).fetchall()

    def advance_scheduled_if_testing(self, every: bool) -> int:
        """Make scheduled jobs due now (all, or only retries): hivejobs.testing.drain."""
        with self.connection() as conn:
            rows = conn.execute(QUERIES["advance_scheduled_if_testing"], {"every": every})
            return len(rows.fetchall())

    def queued_page(
        self, queue: tuple[str, int], after: tuple[datetime, str] | None, limit: int
    ) -> list[tuple[Any, ...]]:
        """One queue's queued jobs after `after` (queued_at, id), oldest first."""
        after_at, after_id = after or (datetime(1970, 1, 1).astimezone(), "")
        params = {
            "name": queue[0],
            "priority": queue[1],
            "after_at": after_at,
            "after_id": after_id,
            "limit": limit,
        }
        with self.connection() as conn:
            return conn.execute(QUERIES["queued_page"], params).fetchall()

    def set_gauges(self, values: Sequence[tuple[str, str, int]]) -> None:
        with self.connection() as conn, conn.transaction():
            for name, queue, value in values:
                conn.execute(QUERIES["set_gauge"], {"name": name, "queue": queue, "value": value})

    def hot_table_size(self, cap: int) -> tuple[int, int]:
        """(live rows, counted up to `cap`; total bytes of the hot table and its indexes)."""
        with self.connection() as conn:
            row = conn.execute(QUERIES["hot_table_size"], {"cap": cap}).fetchone()
        assert row is not None
        return int(row[0]), int(row[1])

    def compact_hot_table(self, timeout_s: float = 300.0) -> None:
        """Give a drained hot table's space back: VACUUM truncates the empty heap, REINDEX
        CONCURRENTLY rebuilds the indexes (VACUUM only marks their pages reusable). Both run
        online, beside enqueues and claims, on a connection of their own without the
        coordinator's lock timeout; leftovers of an interrupted earlier run are dropped."""
        # Behind a pooler no statement_timeout: a session SET would outlive us on a server
        # connection that other clients get next, and VACUUM cannot run in a transaction.
        options = (
            {} if self.pooled else {"options": f"-c statement_timeout={int(timeout_s * 1000)}"}
        )
        with connect(self.url, self.pooled, **options) as conn:
            for (name,) in conn.execute(QUERIES["invalid_hot_indexes"]).fetchall():
                conn.execute(
                    psycopg.sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}").format(
                        psycopg.sql.SQL(name)
                    )
                )
            conn.execute("VACUUM hivejobs_job")
            conn.execute("REINDEX TABLE CONCURRENTLY hivejobs_job")

    def prune_archive(self, retention_s: float) -> int:
        with self.connection() as conn:
            cur = conn.execute(QUERIES["prune_archive"], {"retention_s": retention_s})
            conn.execute(QUERIES["prune_unique"])  # unique windows that have passed
            return cur.rowcount


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


def _text(value: str | None) -> str | None:
    """Postgres text cannot hold NUL or a lone surrogate; an error message from user code
    might (the pool makes its errors storable first; this guards every other writer)."""
    if value is None:
        return None
    value = value.replace("\x00", "\\x00")
    try:
        value.encode()
    except UnicodeEncodeError:
        value = value.encode(errors="backslashreplace").decode()
    return value


def _insert_own(conn: Conn, job: NewJob, explicit_id: bool) -> Inserted:
    """The enqueue as its own transaction (the store's connection, or an autocommit one)."""
    if not explicit_id and job.unique is None:  # one statement: atomic on its own
        return run_plan(conn, insert_plan(job, False))
    with conn.transaction():
        return run_plan(conn, enqueue_plan(job, explicit_id, in_caller=False))


def new_worker_id() -> str:
    """A fresh identity for every process start (R4)."""
    return str(uuid.uuid4())
