"""Chain statements: chains, chain jobs, sequences and the job log (chain_queries.sql).

Part of store/, so the only chain code that speaks SQL. Decides nothing: the traverser hands
in a Plan computed from a Snapshot, and this module writes it inside the transaction that
read the snapshot, under the leader lease (rule R7 in docs/concepts/reliability.md) and the
chain's row lock. Imported by the store package itself (Store.finish suspends chain tries),
so it never imports it back.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, NamedTuple

from psycopg.errors import DeadlockDetected
from psycopg.rows import dict_row

from hivejobs.config import scrub_known
from hivejobs.records import ChainQuery, Completion, Lease, Push
from hivejobs.store.enqueue import caller_savepoint, owns_transaction
from hivejobs.store.leases import LEASES
from hivejobs.store.sql import Steps, load_queries, run_plan

if TYPE_CHECKING:
    import psycopg

    from hivejobs.store import Store

    Conn = psycopg.Connection[Any]
    Cursor = psycopg.Cursor[Any]


CHAIN_QUERIES = load_queries("chain_queries.sql")
LEASE_HOLD = LEASES["lease_hold"]  # pipelined with the reads
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
                "waits": [s["retry_wait_s"] for s in sequences],
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
        "waits": [j["retry_wait_s"] for j in jobs],
        "added_by": added_by,
    }


# -- what ctx.chain.add reads and writes ---------------------------------------------------


class StoredJob(NamedTuple):
    """One chain job as a growth sees it: its place in the DAG."""

    key: str
    after_keys: list[str]
    state: str
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


# -- what the traverser reads and writes ---------------------------------------------------


@dataclass
class JobRow:
    """One chain job as stored (load_chain_jobs); the plan changes it in place."""

    key: str
    name: str
    payload: bytes
    priority: int
    delivery: str
    after_keys: list[str]
    seq: str | None
    tries: int
    retry_wait_s: float
    state: str
    try_: int
    total_tries: int
    job_id: str | None
    not_before: datetime | None


@dataclass
class FinishedTry:
    """A try of the chain found in the archive, not yet reaped."""

    key: str
    id: str
    state: str  # archive state: succeeded, failed, cancelled, expired
    error: str | None
    result: bytes | None
    started_at: datetime | None
    finished_at: datetime


@dataclass
class Snapshot:
    """Everything one pass reads of one chain, in the transaction that writes its plan."""

    id: str
    state: str
    stop_requested: bool
    now: datetime
    jobs: dict[str, JobRow]
    seq_tries: dict[str, int]  # start key -> sequence try under way
    seq_limits: dict[str, tuple[int, float]]  # start key -> (retries, retry_wait_s)
    finished: list[FinishedTry]
    stop_by: datetime | None = None  # a stop gives up on tries still running at this time


@dataclass
class JobChange:
    """One chain job's update, fenced on the state it was read in (`was`)."""

    key: str
    was: str
    state: str
    try_: int
    total_tries: int
    job_id: str | None
    not_before: datetime | None = None
    mode: str = "keep"  # reap | start | reset | keep
    started_at: datetime | None = None
    finished_at: datetime | None = None
    result: bytes | None = None
    error: str | None = None


@dataclass
class LogRow:
    """One job-log row: a try that ended."""

    key: str
    try_: int
    name: str
    job_id: str
    seq_try: int | None
    state: str
    started_at: datetime | None
    finished_at: datetime
    error: str | None


@dataclass
class Plan:
    """What one pass decided for one chain: the store writes it as it is."""

    state: str
    wake_at: datetime | None = None
    resumed: bool = False
    changes: list[JobChange] = field(default_factory=list)
    log: list[LogRow] = field(default_factory=list)
    tries: list[JobRow] = field(default_factory=list)  # rows already moved to their new try
    seq_tries: dict[str, int] = field(default_factory=dict)
    abandon: list[str] = field(default_factory=list)  # try ids that ignored the stop
    abandon_error: str = ""


class TryContext(NamedTuple):
    """A chain try's place in its chain (try_context): the handler's ctx.chain."""

    chain_id: str
    key: str
    total_try: int
    after_keys: list[str]
    payload: bytes


class StaleSnapshot(Exception):  # control flow (traverse the chain again), not an error
    """A plan's fenced update missed a row: the transaction is rolled back, nothing written."""


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

    # -- traverser -----------------------------------------------------------------------

    def chains_to_traverse(self, limit: int) -> list[str]:
        with self.store.connection() as conn:
            rows = conn.execute(CHAIN_QUERIES["chains_to_traverse"], {"limit": limit})
            return [r[0] for r in rows.fetchall()]

    def traverse(
        self, lease: Lease, chain_id: str, plan: Callable[[Snapshot], Plan | None]
    ) -> list[Push] | None:
        """Read one chain, let `plan` decide, write the plan; one transaction under the lease.

        None when the lease is gone (nothing written). A crash anywhere before COMMIT leaves
        the chain as it was, so the next leader recomputes the same plan (idempotence).

        Pipelined: the reads go out as one round trip, the writes as another, then COMMIT;
        a hop's latency is mostly these round trips. A plan that does not end the chain
        commits asynchronously: lost in a Postgres crash, it is recomputed from the state
        before it (its new tries were in the same transaction, so they are gone too, and a
        later synchronous commit, such as an at-most-once claim, flushes it first).
        """
        with self.store.connection() as conn, conn.pipeline() as pipeline, conn.transaction():
            held = conn.execute(LEASE_HOLD, {"holder": lease[0], "term": lease[1]})
            reads = self._read(conn, chain_id)
            # A Sync, not just a flush: the session must show "idle in transaction" while we
            # plan, so that idle_in_transaction_session_timeout ends a stalled leader (I7).
            pipeline.sync()
            if held.fetchone() is None:
                return None
            snapshot = self._snapshot(*reads)
            if snapshot is None:
                return []
            decided = plan(snapshot)
            if decided is None:
                return []
            return self._write(conn, chain_id, decided)

    def _read(self, conn: Conn, chain_id: str) -> tuple[Cursor, Cursor, Cursor, Cursor]:
        """Queue the snapshot's reads (the chain row lock first) in the pipeline."""
        params = {"id": chain_id}
        queries = ("lock_chain", "load_chain_jobs", "load_chain_sequences", "finished_tries")
        head, jobs, seqs, finished = (conn.execute(CHAIN_QUERIES[q], params) for q in queries)
        return head, jobs, seqs, finished

    def _snapshot(
        self, head_cur: Cursor, jobs_cur: Cursor, seq_cur: Cursor, finished_cur: Cursor
    ) -> Snapshot | None:
        head = head_cur.fetchone()
        if head is None:
            return None
        jobs = {r[0]: JobRow(*r) for r in jobs_cur.fetchall()}
        for row in jobs.values():
            row.payload = bytes(row.payload)
        seq_tries: dict[str, int] = {}
        seq_limits: dict[str, tuple[int, float]] = {}
        for start, retries, wait_s, seq_try in seq_cur.fetchall():
            seq_tries[start] = seq_try
            seq_limits[start] = (retries, wait_s)
        finished = [FinishedTry(*r) for r in finished_cur.fetchall()]
        for done in finished:
            done.result = None if done.result is None else bytes(done.result)
        chain_id, state, stop_requested, now, stop_by = head
        return Snapshot(
            id=chain_id,
            state=state,
            stop_requested=stop_requested,
            now=now,
            jobs=jobs,
            seq_tries=seq_tries,
            seq_limits=seq_limits,
            finished=finished,
            stop_by=stop_by,
        )

    def _write(self, conn: Conn, chain_id: str, plan: Plan) -> list[Push]:
        """Queue the plan's statements in the pipeline; results are read once, at the end."""
        if plan.state not in ("succeeded", "failed", "stopped"):
            conn.execute(CHAIN_QUERIES["commit_async"])
        if plan.abandon:
            conn.execute(
                CHAIN_QUERIES["abandon_tries"], {"ids": plan.abandon, "error": plan.abandon_error}
            )
        updated = None
        if plan.changes:
            ch = plan.changes
            updated = conn.execute(
                CHAIN_QUERIES["update_chain_jobs"],
                {
                    "id": chain_id,
                    "keys": [c.key for c in ch],
                    "was": [c.was for c in ch],
                    "states": [c.state for c in ch],
                    "tries": [c.try_ for c in ch],
                    "totals": [c.total_tries for c in ch],
                    "job_ids": [c.job_id for c in ch],
                    "not_befores": [c.not_before for c in ch],
                    "started": [c.started_at for c in ch],
                    "finished": [c.finished_at for c in ch],
                    "results": [c.result for c in ch],
                    "errors": [c.error for c in ch],
                    "modes": [c.mode for c in ch],
                },
            )
        if plan.log:
            lg = plan.log
            conn.execute(
                CHAIN_QUERIES["insert_job_log"],
                {
                    "id": chain_id,
                    "keys": [r.key for r in lg],
                    "tries": [r.try_ for r in lg],
                    "names": [r.name for r in lg],
                    "job_ids": [r.job_id for r in lg],
                    "seq_tries": [r.seq_try for r in lg],
                    "states": [r.state for r in lg],
                    "started": [r.started_at for r in lg],
                    "finished": [r.finished_at for r in lg],
                    "errors": [r.error for r in lg],
                },
            )
        if plan.seq_tries:
            conn.execute(
                CHAIN_QUERIES["update_sequence_tries"],
                {
                    "id": chain_id,
                    "starts": list(plan.seq_tries),
                    "seq_tries": list(plan.seq_tries.values()),
                },
            )
        inserted = None
        if plan.tries:
            tr = plan.tries
            inserted = conn.execute(
                CHAIN_QUERIES["insert_tries"],
                {
                    "chain_id": chain_id,
                    "ids": [t.job_id for t in tr],
                    "names": [t.name for t in tr],
                    "priorities": [t.priority for t in tr],
                    "deliveries": [t.delivery for t in tr],
                    "payloads": [t.payload for t in tr],
                },
            )
        conn.execute(
            CHAIN_QUERIES["update_chain"],
            {"id": chain_id, "state": plan.state, "wake_at": plan.wake_at, "resumed": plan.resumed},
        )
        if updated is not None and len(updated.fetchall()) != len(plan.changes):
            # A job changed under the plan (a pool stopped a try meanwhile): roll back.
            raise StaleSnapshot(chain_id)
        return [Push(*r) for r in inserted.fetchall()] if inserted is not None else []
