"""The traverser's pass over one chain (traversal.sql): read a Snapshot, let the planner
decide, write its Plan, in one transaction.

Part of store/, so it speaks SQL and decides nothing: the traverser (coordinator/traverser.py)
hands in the function that turns a Snapshot into a Plan, and this module writes that plan
inside the transaction that read the snapshot, under the leader lease (rule R7 in
docs/concepts/reliability.md) and the chain's row lock (lock_chain, the chain statements').
Chains are created, stopped, grown and read in chains.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

import psycopg

from hivejobs.records.chains import ChainJobState, ChainState, JobLogState
from hivejobs.records.dispatch import Lease, Push
from hivejobs.records.jobs import Delivery, TerminalState
from hivejobs.store.chains import CHAIN_QUERIES
from hivejobs.store.leases import LEASES
from hivejobs.store.sql import load_queries

if TYPE_CHECKING:
    from hivejobs.store import Store

    Conn = psycopg.Connection[Any]
    Cursor = psycopg.Cursor[Any]


TRAVERSAL_QUERIES = load_queries("traversal.sql")
LEASE_HOLD = LEASES["lease_hold"]  # pipelined with the reads

# What an update does to the try's details (update_chain_jobs): keep them, reap them from the
# finished try, clear the times for a new try (start), clear all for a sequence retry (reset).
ChangeMode = Literal["keep", "reap", "start", "reset"]


@dataclass
class JobRow:
    """One chain job as stored (load_chain_jobs); the plan changes it in place."""

    key: str
    name: str
    payload: bytes
    priority: int
    delivery: Delivery
    after_keys: list[str]
    seq: str | None
    tries: int
    retry_wait_s: float
    state: ChainJobState
    try_: int
    total_tries: int
    job_id: str | None
    not_before: datetime | None
    seq_key: str | None = None  # a sequenced step's key (sequence_by), None otherwise
    seq_hold: bool = False  # its type's on_failure="hold"
    has_place: bool = False  # it holds a place in its key's line (take_places)


@dataclass
class FinishedTry:
    """A try of the chain found in the archive, not yet reaped."""

    key: str
    id: str
    state: TerminalState  # as archived
    error: str | None
    result: bytes | None
    started_at: datetime | None
    finished_at: datetime


@dataclass
class Snapshot:
    """Everything one pass reads of one chain, in the transaction that writes its plan."""

    id: str
    state: ChainState
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
    was: ChainJobState
    state: ChainJobState
    try_: int
    total_tries: int
    job_id: str | None
    not_before: datetime | None = None
    mode: ChangeMode = "keep"
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
    state: JobLogState
    started_at: datetime | None
    finished_at: datetime
    error: str | None


@dataclass
class Plan:
    """What one pass decided for one chain: the store writes it as it is."""

    state: ChainState
    wake_at: datetime | None = None
    resumed: bool = False
    changes: list[JobChange] = field(default_factory=list)
    log: list[LogRow] = field(default_factory=list)
    tries: list[JobRow] = field(default_factory=list)  # rows already moved to their new try
    seq_tries: dict[str, int] = field(default_factory=dict)
    abandon: list[str] = field(default_factory=list)  # try ids that ignored the stop
    abandon_error: str = ""
    # Sequenced steps whose place in their key's line goes (step key -> hold the key).
    end_places: dict[str, bool] = field(default_factory=dict)


class StaleSnapshot(Exception):  # control flow (traverse the chain again), not an error
    """A plan's fenced update missed a row: the transaction is rolled back, nothing written."""


class LockBusy(StaleSnapshot):
    """A lock the pass needed stayed taken past its lock timeout: most often a sequenced
    step's key counter (PLACE_LOCK_TIMEOUT_MS), held by an enqueuer of the key whose
    transaction has not committed; or the chain's row (the coordinator's lock_timeout).
    Nothing written; the chain is traversed again later and the pass's other chains go on."""


# How long a pass waits for a key's counter row to take a step's place (take_places).
PLACE_LOCK_TIMEOUT_MS = 100


class TraversalStore:
    """The traverser's reads and writes over a Store's connection pool; holds no state."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def chains_to_traverse(self, limit: int) -> list[str]:
        with self.store.connection() as conn:
            rows = conn.execute(TRAVERSAL_QUERIES["chains_to_traverse"], {"limit": limit})
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
        try:
            return self._traverse(lease, chain_id, plan)
        except psycopg.errors.LockNotAvailable:
            raise LockBusy(chain_id) from None

    def _traverse(
        self, lease: Lease, chain_id: str, plan: Callable[[Snapshot], Plan | None]
    ) -> list[Push] | None:
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
        head = conn.execute(CHAIN_QUERIES["lock_chain"], params)
        queries = ("load_chain_jobs", "load_chain_sequences", "finished_tries")
        jobs, seqs, finished = (conn.execute(TRAVERSAL_QUERIES[q], params) for q in queries)
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
            conn.execute(TRAVERSAL_QUERIES["commit_async"])
        if plan.abandon:
            conn.execute(
                TRAVERSAL_QUERIES["abandon_tries"],
                {"ids": plan.abandon, "error": plan.abandon_error},
            )
        updated = ended = None
        if plan.changes:
            ch = plan.changes
            updated = conn.execute(
                TRAVERSAL_QUERIES["update_chain_jobs"],
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
                TRAVERSAL_QUERIES["insert_job_log"],
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
                TRAVERSAL_QUERIES["update_sequence_tries"],
                {
                    "id": chain_id,
                    "starts": list(plan.seq_tries),
                    "seq_tries": list(plan.seq_tries.values()),
                },
            )
        inserted = None
        if plan.end_places:
            ended = conn.execute(
                TRAVERSAL_QUERIES["end_places"],
                {
                    "chain_id": chain_id,
                    "steps": list(plan.end_places),
                    "holds": list(plan.end_places.values()),
                },
            )
        if plan.tries:
            tr = plan.tries
            placed = [t for t in tr if t.seq_key is not None]
            if placed:
                timeout = {"timeout_ms": str(PLACE_LOCK_TIMEOUT_MS)}
                conn.execute(TRAVERSAL_QUERIES["place_lock_timeout"], timeout)
                conn.execute(
                    TRAVERSAL_QUERIES["take_places"],
                    {
                        "chain_id": chain_id,
                        "steps": [t.key for t in placed],
                        "names": [t.name for t in placed],
                        "keys": [t.seq_key for t in placed],
                    },
                )
                conn.execute(TRAVERSAL_QUERIES["restore_lock_timeout"])
            inserted = conn.execute(
                TRAVERSAL_QUERIES["insert_tries"],
                {
                    "chain_id": chain_id,
                    "ids": [t.job_id for t in tr],
                    "names": [t.name for t in tr],
                    "priorities": [t.priority for t in tr],
                    "deliveries": [t.delivery for t in tr],
                    "payloads": [t.payload for t in tr],
                    "steps": [t.key for t in tr],
                },
            )
        conn.execute(
            TRAVERSAL_QUERIES["update_chain"],
            {"id": chain_id, "state": plan.state, "wake_at": plan.wake_at, "resumed": plan.resumed},
        )
        if updated is not None and len(updated.fetchall()) != len(plan.changes):
            # A job changed under the plan (a pool stopped a try meanwhile): roll back.
            raise StaleSnapshot(chain_id)
        pushes = [Push(*r) for r in inserted.fetchall()] if inserted is not None else []
        return pushes + ([Push(*r) for r in ended.fetchall()] if ended is not None else [])
