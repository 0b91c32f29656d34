"""Flow-control statements (flow.sql): pause state and the limited claim.

Part of store/: decides nothing. flow.py says how many jobs a claim may take; this module
reads the counts it decides on and claims under the type's flow-row lock, in one
transaction, so two pools anywhere in the fleet never both see the same free slot.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

import msgspec
import psycopg
from psycopg.rows import class_row

from hivejobs.records.jobs import ClaimedJob
from hivejobs.store.sql import load_queries

if TYPE_CHECKING:
    from hivejobs.store import Store

QUERIES = load_queries("flow.sql")
Conn = psycopg.Connection[Any]


class FlowState(msgspec.Struct, frozen=True, kw_only=True):
    """A type's flow row as a claim sees it: pause, bucket, and the fleet's running count."""

    paused: bool
    concurrency: int | None = None  # `hivejobs scale`: threads per pool process, fleet-wide
    tokens: float
    since_s: float  # since the bucket was last refilled, on the database clock
    running: int  # the type's running jobs; 0 when not counted (counts_running=False)


class PausedType(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    paused_at: datetime


class FlowSettings(msgspec.Struct, frozen=True, kw_only=True):
    """What an operator set on a type (`hivejobs pause`, `hivejobs scale`); the defaults
    stand for a type without a flow row."""

    paused: bool = False
    paused_at: datetime | None = None
    concurrency: int | None = None  # threads per pool process, fleet-wide (None: the code's)


class Room(msgspec.Struct, frozen=True, kw_only=True):
    """What a type's limits allow now (flow.decide): how many jobs to claim, else how long
    to wait; and the token bucket refilled up to now, before this claim takes from it."""

    allowed: int
    wait_s: float
    tokens: float | None  # None: no rate limit, the bucket is not kept


Decide = Callable[[FlowState], Room]


class Bucket(msgspec.Struct, frozen=True):
    """A partition's token bucket as stored: tokens left at its last refill, and the seconds
    since (on flow_lock's clock)."""

    tokens: float
    since_s: float


class Picked(msgspec.Struct, frozen=True, kw_only=True):
    """limit_by's choice: the ids to claim and their partitions, and each candidate
    partition's bucket refilled up to now, before this claim takes from it (empty without
    a rate)."""

    ids: list[str]
    parts: dict[str, str]  # chosen id -> its partition
    tokens: dict[str, float]


# limit_by (flow.choose): (candidates as (id, partition) in pop order, running jobs per
# partition (empty without global_concurrency), the candidate partitions' stored buckets
# (empty without a rate; a missing one is full), how many the type-wide decision allows)
# -> the choice.
Pick = Callable[[list[tuple[str, str]], dict[str, int], dict[str, Bucket], int], Picked]


class LimitBy(msgspec.Struct, frozen=True, kw_only=True):
    """A partitioned limit for claim_limited: the payload field, which counts it needs
    (running rows per partition, buckets per partition), and the choice."""

    field: str
    counts_running: bool
    rate_per_s: float | None
    burst: int
    pick: Pick


class FlowStore:
    """The flow table, over the Store's connection pool."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def ensure(self, name: str) -> None:
        with self.store.connection() as conn:
            conn.execute(QUERIES["ensure_flow"], {"name": name})

    def state(self, name: str, counts_running: bool) -> FlowState | None:
        """The type's state, unlocked (None: never paused nor limited); its running jobs are
        counted only if `counts_running` (a cap on them)."""
        params = {"name": name, "counts_running": counts_running}
        with self.store.connection() as conn:
            cur = conn.cursor(row_factory=class_row(FlowState))
            return cur.execute(QUERIES["flow_room"], params).fetchone()

    def claim_limited(
        self,
        conn: Conn,
        ids: list[str],
        worker_id: str,
        name: str,
        decide: Decide,
        *,
        counts_running: bool,
        limit_by: LimitBy | None = None,
        sequenced: bool = False,
    ) -> list[ClaimedJob]:
        """Claim at most what `decide` allows, in order, under the type's row lock. The
        lock is held to the commit: the next claimer counts our claims as running and sees
        our tokens taken. The type's running rows are counted only if `counts_running` (a
        cap on them: a rate alone needs no count). With `limit_by`, the running rows are
        counted per partition instead, in the same snapshot, the partitions' buckets are
        read, and `limit_by.pick` chooses the ids whose partition has room and tokens."""
        with conn.transaction():
            row = conn.execute(QUERIES["flow_lock"], {"name": name}).fetchone()
            if row is None:  # the row is made at pool start; a deleted row limits nothing
                return self.store.claim_queued(ids, worker_id, conn, name=name, sequenced=sequenced)
            paused, tokens, now, since_s = row
            running = 0
            if counts_running:
                counted = conn.execute(QUERIES["flow_running"], {"name": name}).fetchone()
                running = counted[0] if counted else 0
            state = FlowState(paused=paused, tokens=tokens, since_s=since_s, running=running)
            room = decide(state)
            picked = None
            if limit_by is None:
                chosen = ids[: room.allowed]
            else:
                picked = self._pick(conn, ids, name, limit_by, room.allowed, now)
                chosen = picked.ids
            jobs = (
                self.store.claim_queued(chosen, worker_id, conn, name=name, sequenced=sequenced)
                if chosen
                else []
            )
            if room.tokens is not None:
                # The bucket loses what was claimed, not what was allowed: a duplicate id
                # claims nothing and costs no token.
                level = room.tokens - len(jobs)
                conn.execute(
                    QUERIES["flow_take_tokens"], {"name": name, "tokens": level, "now": now}
                )
            if picked is not None and limit_by is not None and limit_by.rate_per_s is not None:
                self._take_partition_tokens(conn, name, limit_by, picked, jobs, now)
            return jobs

    def _pick(
        self, conn: Conn, ids: list[str], name: str, limit_by: LimitBy, allowed: int, now: datetime
    ) -> Picked:
        """The ids limit_by allows; with a rate, the buckets they take from as well."""
        if allowed <= 0:
            return Picked(ids=[], parts={}, tokens={})
        params: dict[str, object] = {"ids": ids, "name": name, "field": limit_by.field}
        parts: dict[str, str] = dict(conn.execute(QUERIES["flow_partitions"], params).fetchall())
        candidates = [(i, parts[i]) for i in ids if i in parts]
        if not candidates:
            return Picked(ids=[], parts={}, tokens={})
        params["parts"] = sorted({p for _, p in candidates})
        running: dict[str, int] = {}
        if limit_by.counts_running:
            rows = conn.execute(QUERIES["flow_running_by_partition"], params).fetchall()
            running = dict(rows)
        buckets: dict[str, Bucket] = {}
        if limit_by.rate_per_s is not None:
            params["now"] = now
            rows = conn.execute(QUERIES["flow_buckets"], params).fetchall()
            buckets = {part: Bucket(tokens, since_s) for part, tokens, since_s in rows}
        return limit_by.pick(candidates, running, buckets, allowed)

    def _take_partition_tokens(
        self,
        conn: Conn,
        name: str,
        limit_by: LimitBy,
        picked: Picked,
        jobs: list[ClaimedJob],
        now: datetime,
    ) -> None:
        """Each partition's bucket loses what was claimed in it (not what was chosen: a
        duplicate id claims nothing and costs no token); a partition that claimed nothing
        keeps its row as it is, which still refills right from its own refilled_at."""
        rate = limit_by.rate_per_s
        if rate is None or not jobs:
            return
        claimed: dict[str, int] = {}
        for job in jobs:
            part = picked.parts[job.id]
            claimed[part] = claimed.get(part, 0) + 1
        parts = sorted(claimed)
        levels = [picked.tokens[p] - claimed[p] for p in parts]
        conn.execute(
            QUERIES["flow_take_partition_tokens"],
            {
                "name": name,
                "now": now,
                "parts": parts,
                "tokens": levels,
                "refill_s": [max(0.0, (limit_by.burst - level) / rate) for level in levels],
            },
        )

    def refused(self, ids: list[str], name: str) -> list[str]:
        """Of ids popped but not claimed, those still waiting for a pool of `name`."""
        with self.store.connection() as conn:
            rows = conn.execute(QUERIES["flow_refused"], {"ids": ids, "name": name}).fetchall()
        return [r[0] for r in rows]

    def pause(self, name: str) -> bool:
        """True if the type was running and is now paused."""
        with self.store.connection() as conn:
            return conn.execute(QUERIES["pause_type"], {"name": name}).fetchone() is not None

    def resume(self, name: str) -> bool:
        """True if the type was paused and now runs again."""
        with self.store.connection() as conn:
            return conn.execute(QUERIES["resume_type"], {"name": name}).fetchone() is not None

    def paused(self) -> list[PausedType]:
        with self.store.connection() as conn:
            cur = conn.cursor(row_factory=class_row(PausedType))
            return cur.execute(QUERIES["paused_types"]).fetchall()

    def settings(self, name: str) -> FlowSettings:
        """The type's pause and scale as set (the defaults when it has no flow row)."""
        with self.store.connection() as conn:
            cur = conn.cursor(row_factory=class_row(FlowSettings))
            row = cur.execute(QUERIES["flow_settings"], {"name": name}).fetchone()
        return FlowSettings() if row is None else row

    def pool_settings(self, name: str) -> tuple[bool, int | None]:
        """(paused, scaled concurrency or None) of an unlimited type."""
        settings = self.settings(name)
        return settings.paused, settings.concurrency

    def scale(self, name: str, concurrency: int | None) -> None:
        with self.store.connection() as conn:
            conn.execute(QUERIES["scale_type"], {"name": name, "concurrency": concurrency})
