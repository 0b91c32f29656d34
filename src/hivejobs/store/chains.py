"""Chain statements: chains, chain jobs, sequences and the job log (chain_queries.sql).

Part of store/, so with traversal.py (the traverser's pass) the only chain code that speaks
SQL: create, stop and grow a chain, read it, and what a chain try's handler reads and writes.
Decides nothing. Imported by the store package itself (Store.finish suspends chain tries), so
it never imports it back.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from psycopg.errors import DeadlockDetected
from psycopg.rows import dict_row

from hivejobs.records.chains import ChainJobState, ChainQuery
from hivejobs.records.jobs import Completion
from hivejobs.store.enqueue import caller_savepoint, owns_transaction
from hivejobs.store.sql import Steps, load_queries, run_plan
from hivejobs.urls import scrub_known

if TYPE_CHECKING:
    import psycopg

    from hivejobs.store import Store

    Conn = psycopg.Connection[Any]
    Cursor = psycopg.Cursor[Any]


CHAIN_QUERIES = load_queries("chain_queries.sql")
# A stop that deadlocks with the traverser is tried again this many times in all.
STOP_TRIES = 5


def create_chain_plan(
    chain: dict[str, Any], jobs: list[dict[str, Any]], sequences: list[dict[str, Any]]
) -> Steps[None]:
    """The statements that store a validated chain; the last one wakes the traverser."""
    yield CHAIN_QUERIES["insert_chain"], chain
    yield CHAIN_QUERIES["insert_chain_jobs"], _chain_job_params(chain["id"], jobs, None)
    if sequences:
        yield (
            CHAIN_QUERIES["insert_chain_sequences"],
            {
                "chain_id": chain["id"],
                "starts": [s["start"] for s in sequences],
                "retries": [s["retries"] for s in sequences],
                "waits": [float(s["retry_wait_s"]) for s in sequences],
            },
        )
    yield CHAIN_QUERIES["wake_traverser"], {"id": chain["id"]}


def _chain_job_params(
    chain_id: str, jobs: list[dict[str, Any]], added_by: str | None
) -> dict[str, Any]:
    return {
        "chain_id": chain_id,
        "keys": [j["key"] for j in jobs],
        "names": [j["name"] for j in jobs],
        "payloads": [j["payload"] for j in jobs],
        "priorities": [j["priority"] for j in jobs],
        "deliveries": [j["delivery"] for j in jobs],
        "afters": [" ".join(j["after"]) for j in jobs],
        "seqs": [j["seq"] for j in jobs],
        "tries": [j["tries"] for j in jobs],
        # float(): `retry_wait=30` beside a 0.0 would make a list psycopg cannot dump.
        "waits": [float(j["retry_wait_s"]) for j in jobs],
        "seq_keys": [j.get("seq_key") for j in jobs],
        "seq_holds": [j.get("seq_hold", False) for j in jobs],
        "added_by": added_by,
    }


# -- what ctx.chain.add reads and writes ---------------------------------------------------


class StoredJob(NamedTuple):
    """One chain job as a growth sees it: its place in the DAG."""

    key: str
    after_keys: list[str]
    state: ChainJobState
    seq: str | None
    added_by: str | None


@dataclass
class GrowthSnapshot:
    """The chain a running try grows, read under the chain's row lock."""

    chain_id: str
    adder: str  # the key of the chain job whose current try adds
    jobs: dict[str, StoredJob]


@dataclass
class GrowthWrite:
    """What one ctx.chain.add writes: new rows (already checked), and the new keys each
    existing pending job must now also wait for."""

    rows: list[dict[str, Any]]
    before: dict[str, list[str]] = field(default_factory=dict)


class TryContext(NamedTuple):
    """A chain try's place in its chain (try_context): the handler's ctx.chain."""

    chain_id: str
    key: str
    total_try: int
    after_keys: list[str]
    payload: bytes


def try_id(chain_id: str, key: str, total_try: int) -> str:
    """The job id of one try: unique for ever, so re-inserting it after a crash is a no-op."""
    return f"{chain_id}:{key}:{total_try}"


# Keys of added jobs (chains/growth.py) run to 200 characters.
_TRY_ID_RE = re.compile(r"^[0-9a-f]{32}:[A-Za-z0-9_.\-]{1,200}:[0-9]+$")


def looks_like_try_id(job_id: str) -> bool:
    """True for the shape try_id() makes: spares plain jobs a statement (a plain job that
    happens to match costs one statement that finds nothing)."""
    return _TRY_ID_RE.match(job_id) is not None


# -- called by Store.finish, inside the completer's transaction ----------------------------


def suspend_chain_tries(conn: Conn, suspends: Sequence[Completion]) -> int:
    """End suspended chain tries (see suspend_chain_tries in chain_queries.sql); returns
    how many were chain tries. The rest are left to the plain requeue."""
    rows = conn.execute(
        CHAIN_QUERIES["suspend_chain_tries"],
        {
            "ids": [c.id for c in suspends],
            "tokens": [c.claim_token for c in suspends],
        },
    ).fetchall()
    if rows:
        conn.execute(CHAIN_QUERIES["wake_traverser"], {"id": ""})  # "" = look for work
    return len(rows)


class ChainStore:
    """Chain reads and writes over a Store's connection pool."""

    def __init__(self, store: Store) -> None:
        self.store = store

    # -- create and user actions ---------------------------------------------------------

    def create(
        self,
        chain: dict[str, Any],
        jobs: list[dict[str, Any]],
        sequences: list[dict[str, Any]],
        conn: Conn | None = None,
    ) -> None:
        """Store a validated chain in one transaction and wake the traverser on commit: the
        store's own transaction, or `conn`'s (under a savepoint; the caller commits)."""
        plan = create_chain_plan(chain, jobs, sequences)
        if conn is None:
            with self.store.connection() as own, own.transaction():
                run_plan(own, plan)
        elif owns_transaction(conn):
            with conn.transaction():
                run_plan(conn, plan)
        else:
            with caller_savepoint(conn):
                run_plan(conn, plan)

    def grow(
        self, chain_id: str, job_id: str, decide: Callable[[GrowthSnapshot], GrowthWrite]
    ) -> GrowthWrite | None:
        """Add jobs to a chain from its running try `job_id`, in one transaction under the
        chain's row lock (the traverser's order: chain row, then its jobs), so that the
        traverser plans either without them or with all of them. `decide` sees the chain as
        stored and returns what to write, or raises (ChainInvalid): then nothing is written.
        None when `job_id` is not the current running try of its chain job (stopped,
        abandoned, rescued, or the chain ended): nothing is written either. No wake-up: every
        added job runs after the adding one, which is still running."""
        params = {"id": chain_id, "job_id": job_id}
        attempt = 0
        while True:
            attempt += 1
            try:
                with self.store.connection() as conn, conn.transaction():
                    if conn.execute(CHAIN_QUERIES["lock_chain"], params).fetchone() is None:
                        return None
                    row = conn.execute(CHAIN_QUERIES["growing_try"], params).fetchone()
                    if row is None:
                        return None
                    jobs = conn.execute(CHAIN_QUERIES["growth_rows"], params).fetchall()
                    snapshot = GrowthSnapshot(chain_id, row[0], {r[0]: StoredJob(*r) for r in jobs})
                    growth = decide(snapshot)
                    self._write_growth(conn, chain_id, snapshot.adder, growth)
                return growth
            except DeadlockDetected:
                # As in request_stop: rolled back whole, nothing kept; the same growth again.
                if attempt >= STOP_TRIES:
                    raise
                time.sleep(random.uniform(0.0, 0.05 * attempt))

    def _write_growth(self, conn: Conn, chain_id: str, adder: str, growth: GrowthWrite) -> None:
        if growth.rows:
            conn.execute(
                CHAIN_QUERIES["insert_chain_jobs"], _chain_job_params(chain_id, growth.rows, adder)
            )
            conn.execute(CHAIN_QUERIES["count_added_jobs"], {"id": chain_id, "n": len(growth.rows)})
        if growth.before:
            conn.execute(
                CHAIN_QUERIES["wait_for_added_jobs"],
                {
                    "id": chain_id,
                    "keys": list(growth.before),
                    "afters": [" ".join(keys) for keys in growth.before.values()],
                },
            )

    def request_stop(self, chain_id: str, timeout_s: float) -> tuple[bool, list[str]]:
        """Flag the chain stopped, end its waiting tries, and mark its running tries
        cancel-requested; tries still running `timeout_s` later are abandoned by the
        traverser. Returns (was live, running try ids to tell their pools)."""
        params = {"id": chain_id}
        stop = {"id": chain_id, "timeout_s": timeout_s}
        attempt = 0
        while True:
            attempt += 1
            try:
                with self.store.connection() as conn, conn.transaction():
                    if conn.execute(CHAIN_QUERIES["request_stop"], stop).fetchone() is None:
                        return False, []
                    conn.execute(CHAIN_QUERIES["cancel_waiting_tries"], params)
                    running = conn.execute(CHAIN_QUERIES["cancel_running_tries"], params)
                    ids = [r[0] for r in running.fetchall()]
                    conn.execute(CHAIN_QUERIES["wake_traverser"], params)
                return True, ids
            except DeadlockDetected:
                # The traverser locks the same chain and tries in its own order: Postgres broke
                # the cycle by rolling this transaction back, nothing of it is kept, and the
                # traverser's side has committed or will soon: the same stop again succeeds.
                if attempt >= STOP_TRIES:
                    raise
                time.sleep(random.uniform(0.0, 0.05 * attempt))

    # -- reads ---------------------------------------------------------------------------

    def get(self, chain_id: str) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
        with self.store.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            chain = cur.execute(CHAIN_QUERIES["get_chain"], {"id": chain_id}).fetchone()
            if chain is None:
                return None
            jobs = cur.execute(CHAIN_QUERIES["chain_job_rows"], {"id": chain_id}).fetchall()
        return chain, jobs

    def job_log(self, chain_id: str) -> list[dict[str, Any]]:
        with self.store.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            return cur.execute(CHAIN_QUERIES["job_log"], {"id": chain_id}).fetchall()

    def list_chains(self, query: ChainQuery) -> list[dict[str, Any]]:
        before_at, before_id = query.before or (None, None)
        params = {
            "states": list(query.states) if query.states else None,
            "type": query.type,
            "job_type": query.job_type,
            "since": query.since,
            "until": query.until,
            "before_at": before_at,
            "before_id": before_id,
            "limit": query.limit,
        }
        with self.store.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            return cur.execute(CHAIN_QUERIES["list_chains"], params).fetchall()

    def running_tries(self, limit: int) -> list[dict[str, Any]]:
        with self.store.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            return cur.execute(CHAIN_QUERIES["running_tries"], {"limit": limit}).fetchall()

    # -- handlers (ctx.chain, ctx.upstream, ctx.set_status) --------------------------------

    def try_context(self, job_id: str) -> TryContext | None:
        """What a chain try's handler sees of its chain; None for a plain job. Found by the
        primary key that the try's id spells (try_id), so a chain try costs the same lookup
        however many chain jobs the database holds."""
        if not looks_like_try_id(job_id):
            return None
        chain_id, _, rest = job_id.partition(":")
        params = {"id": chain_id, "key": rest.rpartition(":")[0], "job_id": job_id}
        with self.store.connection() as conn:
            row = conn.execute(CHAIN_QUERIES["try_context"], params).fetchone()
        if row is None:
            return None
        chain_id, key, total_try, after_keys, payload = row
        return TryContext(chain_id, key, total_try, after_keys, bytes(payload))

    def upstream(self, chain_id: str, keys: list[str]) -> dict[str, bytes | None]:
        with self.store.connection() as conn:
            rows = conn.execute(
                CHAIN_QUERIES["upstream_results"], {"id": chain_id, "keys": keys}
            ).fetchall()
        return {r[0]: None if r[1] is None else bytes(r[1]) for r in rows}

    def ancestors(self, chain_id: str, key: str) -> set[str]:
        with self.store.connection() as conn:
            rows = conn.execute(CHAIN_QUERIES["ancestors"], {"id": chain_id, "key": key})
            return {r[0] for r in rows.fetchall()}

    def save_output(
        self, job_id: str, stdout: str | None, stderr: str | None, truncated: bool
    ) -> None:
        """Keep a chain try's captured output for the job log (no-op for other jobs), without
        the process's passwords (a handler that prints its DSN)."""
        stdout, stderr = (scrub_known(t) if t else t for t in (stdout, stderr))
        params = {"job_id": job_id, "stdout": stdout, "stderr": stderr, "truncated": truncated}
        with self.store.connection() as conn:
            conn.execute(CHAIN_QUERIES["save_try_output"], params)

    def set_status(self, job_id: str, status: str) -> bool:
        params = {"job_id": job_id, "status": scrub_known(status)}
        with self.store.connection() as conn:
            row = conn.execute(CHAIN_QUERIES["set_status"], params).fetchone()
        return row is not None
