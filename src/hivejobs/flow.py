"""Flow control of job types: pause/resume and fleet-wide limits.

Limits are job type options (`global_concurrency`, `rate`, `burst`); pause is state in
Postgres (`hivejobs_flow`), so it holds across instances, restarts and Redis flushes.
Everything is enforced where a job starts, at claim time, in Postgres:

- pause: `claim_queued` claims nothing of a paused type (one primary-key lookup);
- global_concurrency: a slot is a `running` row of the type. A limited claim locks the
  type's flow row, counts the running rows in a snapshot taken after the lock, and claims at
  most the difference, so racing pools on any machine never see the same free slot. A dead
  holder's slots come back when the coordinator rescues its claims (the rows stop running):
  no separate lease can leak. A handler runs only between its claim's commit and its
  completion's, so the handlers running at once never outnumber the running rows;
- rate: a token bucket in the same row, refilled on the database clock under the same lock
  (a rate alone counts no running rows: Limits.type_cap);
- limit_by: `global_concurrency` and/or `rate` per distinct value of one payload field (at
  most N running, or R starts a second, per customer, say). The partition is read from the
  payload in the claim, under the same lock: the running rows are counted per partition and
  each partition's token bucket (`hivejobs_flow_bucket`, one row per partition whose bucket
  is not full) is refilled on the database clock; `choose` picks the ids whose partition has
  room and tokens, and the claim writes back the buckets it took from. The type-wide bucket
  is not used then: the rate is per partition. The slots are still the running rows, so a
  dead holder's come back the same way. Ids refused because their partition is full or out
  of tokens go to the tail of their list, so such a partition never blocks the others, and
  a pool that claimed none of them waits (SLOT_POLL_S, or until the soonest partition's next
  token, sooner on its own completions) before it pops again: no hot spin. The coordinator's
  pruner deletes the buckets that have refilled to full (they mean what no row means): the
  claim visits only the partitions it popped, so it could never find a partition that went
  quiet, and the hot path stays free of the extra write.

A pool asks `Flow.room` before it pops: a paused or full type waits there without popping
(no ids bounce through Redis while nothing can run). Ids popped and then refused (a race with
another pool, a pause that landed meanwhile) go back to the head of their list. Never claims
without the lock for a limited type, and never decides from Redis.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass

from hivejobs.broker import Broker, Popped
from hivejobs.errors import InvalidArgument, InvalidJobType
from hivejobs.records.jobs import ClaimedJob
from hivejobs.store import Conn, Store
from hivejobs.store.flow import (
    Bucket,
    FlowSettings,
    FlowState,
    FlowStore,
    LimitBy,
    Picked,
    Room,
)

PAUSE_POLL_S = 1.0  # a paused type's pools look again this often (resume takes up to this)
SLOT_POLL_S = 0.1  # a full type's pools look again this often (sooner on their own completions)
MAX_SCALE = 1000  # threads per pool process `hivejobs scale` may ask for
MAX_RATE_WAIT_S = 1.0  # a rate-limited pool re-reads the bucket at least this often
MIN_WAIT_S = 0.002  # the shortest wait of a limit_by pool that claimed nothing
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*/\s*(s|sec|second|m|min|minute|h|hour)\s*$")
_PER = {"s": 1.0, "sec": 1.0, "second": 1.0, "m": 60.0, "min": 60.0, "minute": 60.0}
_PER |= {"h": 3600.0, "hour": 3600.0}


@dataclass(frozen=True)
class Limits:
    """A job type's fleet-wide limits: running jobs, and starts per second (token bucket
    holding at most `burst` starts)."""

    global_concurrency: int | None = None
    rate_per_s: float | None = None
    burst: int = 1
    limit_by: str | None = None  # global_concurrency counts per value of this payload field

    @property
    def type_cap(self) -> int | None:
        """The cap on the type's running jobs as a whole, the one limit for which decide()
        needs their count (None: a rate alone needs none, and limit_by's cap is per
        partition, counted in the claim: pick_partitions)."""
        return self.global_concurrency if self.limit_by is None else None


def parse_rate(rate: str) -> float:
    """'100/s', '600/m', '5/h' -> starts per second."""
    m = _RATE.match(rate) if isinstance(rate, str) else None
    if m is None or float(m.group(1)) <= 0:
        raise InvalidJobType(
            f"rate must look like '100/s', '30/m' or '5/h' (a positive count per second, "
            f"minute or hour), not {rate!r}"
        )
    return float(m.group(1)) / _PER[m.group(2)]


def checked_limits(
    global_concurrency: int | None,
    rate: str | None,
    burst: int | None,
    limit_by: str | None = None,
) -> Limits | None:
    """The limits of `@app.job(...)`, or a clear InvalidJobType; None when there are none."""
    if limit_by is not None:
        check_limit_by(limit_by, global_concurrency, rate)
    if global_concurrency is not None and (
        isinstance(global_concurrency, bool)
        or not isinstance(global_concurrency, int)
        or global_concurrency < 1
    ):
        raise InvalidJobType(
            f"global_concurrency must be a whole number of jobs, at least 1, not "
            f"{global_concurrency!r}"
        )
    if burst is not None and rate is None:
        raise InvalidJobType("burst needs a rate (burst is the size of the rate's bucket)")
    if burst is not None and (isinstance(burst, bool) or not isinstance(burst, int) or burst < 1):
        raise InvalidJobType(f"burst must be a whole number of jobs, at least 1, not {burst!r}")
    if global_concurrency is None and rate is None:
        return None
    per_s = None if rate is None else parse_rate(rate)
    # Default bucket: one second's worth of starts (at least one).
    default_burst = 1 if per_s is None else max(1, math.floor(per_s))
    return Limits(
        global_concurrency, per_s, burst if burst is not None else default_burst, limit_by
    )


def check_limit_by(limit_by: object, global_concurrency: int | None, rate: str | None) -> None:
    if not isinstance(limit_by, str) or not limit_by:
        raise InvalidJobType(f"limit_by must be the name of a payload field, not {limit_by!r}")
    if global_concurrency is None and rate is None:
        raise InvalidJobType(
            "limit_by needs global_concurrency or rate (limit_by=... caps the running jobs, "
            "or the starts per second, per value of that payload field)"
        )


def choose(
    candidates: list[tuple[str, str]],
    running: dict[str, int],
    per_partition: int | None,
    want: int,
    tokens: dict[str, float] | None = None,
) -> list[str]:
    """Of (id, partition) candidates in pop order, the ids to claim: at most `want`, no
    partition beyond `per_partition` running jobs counting these (None: no cap), and with
    `tokens` (each partition's refilled bucket) no partition beyond its whole tokens.
    Pure: tested with tables (tests/unit/test_flow.py)."""
    taken = dict(running)
    spent: dict[str, int] = {}
    chosen: list[str] = []
    for job_id, part in candidates:
        if len(chosen) >= want:
            break
        if per_partition is not None and taken.get(part, 0) >= per_partition:
            continue
        if tokens is not None and spent.get(part, 0) + 1 > tokens.get(part, 0.0) + 1e-9:
            continue
        taken[part] = taken.get(part, 0) + 1
        spent[part] = spent.get(part, 0) + 1
        chosen.append(job_id)
    return chosen


def refill(bucket: Bucket | None, rate_per_s: float, burst: int) -> float:
    """A bucket's tokens now: what it held plus what the rate added since, up to the burst;
    no row is a full bucket (the coordinator deletes full ones)."""
    if bucket is None:
        return float(burst)
    return min(float(burst), bucket.tokens + bucket.since_s * rate_per_s)


def pick_partitions(
    limits: Limits,
    candidates: list[tuple[str, str]],
    running: dict[str, int],
    buckets: dict[str, Bucket],
    want: int,
) -> Picked:
    """limit_by's choice under the claim's lock: choose() over the partitions' running
    counts and, with a rate, their buckets refilled up to now. Pure."""
    tokens: dict[str, float] = {}
    if limits.rate_per_s is not None:
        for part in {p for _, p in candidates}:
            tokens[part] = refill(buckets.get(part), limits.rate_per_s, limits.burst)
    ids = choose(
        candidates,
        running,
        limits.global_concurrency,
        want,
        tokens if limits.rate_per_s is not None else None,
    )
    part_of = dict(candidates)
    return Picked(ids=ids, parts={i: part_of[i] for i in ids}, tokens=tokens)


def partition_wait_s(limits: Limits, picked: Picked) -> float:
    """How long a limit_by pool that claimed nothing waits before it pops again: a slot
    poll, or less when a partition's next token comes sooner (waiting a whole poll would
    keep a fast partition below its rate). Never zero: no hot spin."""
    wait_s = SLOT_POLL_S
    if limits.rate_per_s is not None:
        for level in picked.tokens.values():
            if level < 1.0:
                wait_s = min(wait_s, (1.0 - level) / limits.rate_per_s)
    return max(wait_s, MIN_WAIT_S)


def decide(limits: Limits | None, want: int, state: FlowState) -> Room:
    """How many of `want` jobs may start now, else how long to wait. Pure: tested with a
    table of states (tests/unit/test_flow.py)."""
    if state.paused:
        return Room(allowed=0, wait_s=PAUSE_POLL_S, tokens=None)
    allowed, wait_s, tokens = want, 0.0, None
    cap = limits.type_cap if limits is not None else None
    if cap is not None:
        # With limit_by the bound is per partition: only the claim (choose) knows which.
        free = max(0, cap - state.running)
        allowed = min(allowed, free)
        if free == 0:
            wait_s = SLOT_POLL_S
    if limits is not None and limits.rate_per_s is not None and limits.limit_by is None:
        # With limit_by the bucket is per partition: only the claim (pick_partitions) knows.
        tokens = min(float(limits.burst), state.tokens + state.since_s * limits.rate_per_s)
        whole = max(0, math.floor(tokens + 1e-9))
        allowed = min(allowed, whole)
        if whole == 0:
            wait_s = max(wait_s, min(MAX_RATE_WAIT_S, (1.0 - tokens) / limits.rate_per_s))
    return Room(allowed=max(0, allowed), wait_s=wait_s if allowed <= 0 else 0.0, tokens=tokens)


class Flow:
    """One pool's view of its type's flow control.

    Owns the cached pause state of an unlimited type (`_paused`, `_checked_at`) and a
    limit_by type's wait after an empty claim (`_empty_wait_s`, set in the claim, read in
    put_back), read and written by the fetcher thread alone, so no lock. The cache only
    spares a query per pop: the claim itself checks the pause, so a stale cache costs a
    bounce, never a start.
    """

    def __init__(
        self,
        store: Store,
        broker: Broker,
        name: str,
        limits: Limits | None,
        sequenced: bool = False,  # sequence_by: claims take the keys' guard (sequence.py)
    ) -> None:
        self.flows = FlowStore(store)
        self.sequenced = sequenced
        self.store = store
        self.broker = broker
        self.name = name
        self.limits = limits
        self._paused = False
        self._checked_at = -math.inf
        self._ensured = False  # a limited type's flow row exists (made at the first look)
        self.concurrency: int | None = None  # `hivejobs scale` (None: the type's own)
        self._empty_wait_s = SLOT_POLL_S  # limit_by: the last claim's partition_wait_s

    def room(self, want: int) -> Room:
        """Before a pop: how many ids to pop, or how long to wait first."""
        if self.limits is None:
            self._read_settings()
            if self._paused:
                return Room(allowed=0, wait_s=PAUSE_POLL_S, tokens=None)
            return Room(allowed=want, wait_s=0.0, tokens=None)
        if not self._ensured:
            self.flows.ensure(self.name)
            self._ensured = True
        state = self.flows.state(self.name, counts_running=self.limits.type_cap is not None)
        if state is None:  # row deleted by hand: made again, limits hold from the next claim
            self._ensured = False
            return Room(allowed=0, wait_s=SLOT_POLL_S, tokens=None)
        self.concurrency = state.concurrency
        return decide(self.limits, want, state)

    def scaled_concurrency(self) -> int | None:
        """`hivejobs scale`'s concurrency (None: the type's own), read at most once per
        PAUSE_POLL_S. For a pool whose runners are all busy: it never asks room(), and a
        scale-up is wanted most exactly then."""
        self._read_settings()
        return self.concurrency

    def _read_settings(self) -> None:
        """Pause and scale from Postgres, at most once per PAUSE_POLL_S (the cache)."""
        now = time.monotonic()
        if now - self._checked_at >= PAUSE_POLL_S:
            self._paused, self.concurrency = self.flows.pool_settings(self.name)
            self._checked_at = now

    def claim(self, conn: Conn, ids: list[str], worker_id: str) -> list[ClaimedJob]:
        """The claim, atomic with the limits: under the type's lock when it has any."""
        if self.limits is None:
            return self.store.claim_queued(
                ids, worker_id, conn, name=self.name, sequenced=self.sequenced
            )
        limits = self.limits
        by = None
        self._empty_wait_s = SLOT_POLL_S  # unless the pick (if any) finds a token sooner
        if limits.limit_by is not None:
            by = LimitBy(
                field=limits.limit_by,
                counts_running=limits.global_concurrency is not None,
                rate_per_s=limits.rate_per_s,
                burst=limits.burst,
                pick=lambda c, r, b, n: self._pick(limits, c, r, b, n),
            )
        return self.flows.claim_limited(
            conn,
            ids,
            worker_id,
            self.name,
            lambda s: decide(limits, len(ids), s),
            counts_running=limits.type_cap is not None,
            limit_by=by,
            sequenced=self.sequenced,
        )

    def _pick(
        self,
        limits: Limits,
        candidates: list[tuple[str, str]],
        running: dict[str, int],
        buckets: dict[str, Bucket],
        want: int,
    ) -> Picked:
        picked = pick_partitions(limits, candidates, running, buckets, want)
        self._empty_wait_s = partition_wait_s(limits, picked)
        return picked

    def put_back(self, popped: Popped, claimed: list[ClaimedJob]) -> float:
        """Ids popped but refused (a pause or a limit reached meanwhile) go back to the head
        of their list, in order; they were never claimed, so nothing else changes. With
        limit_by they go to the tail instead: at the head, a full partition's ids would be
        popped again first and block every other partition. Returns how long to wait before
        the next pop (a limit_by pool that claimed nothing waits for a slot, never spins)."""
        taken = {j.id for j in claimed}
        unclaimed = [i for i in popped.ids if i not in taken]
        if not unclaimed:
            return 0.0
        waiting = set(self.flows.refused(unclaimed, self.name))
        back = [i for i in unclaimed if i in waiting]
        if not back:
            return 0.0
        self._checked_at = -math.inf  # maybe paused meanwhile: look before the next pop
        if self.limits is None or self.limits.limit_by is None:
            self.broker.redis.lpush(popped.key, *reversed(back))
            return 0.0
        self.broker.redis.rpush(popped.key, *back)
        return self._empty_wait_s if not claimed else 0.0


def pause_type(store: Store, name: str) -> bool:
    """Pause a type fleet-wide: running jobs finish, nothing new starts; True if it ran.
    A claim that read the pause state before this commit may still start its jobs."""
    return FlowStore(store).pause(name)


def resume_type(store: Store, name: str) -> bool:
    """Resume a paused type; True if it was paused."""
    return FlowStore(store).resume(name)


def scale_type(store: Store, name: str, concurrency: int | None) -> None:
    """Runner threads per pool process of `name`, fleet-wide, from the pools' next look
    (within a second); None: back to the type's own `concurrency`. A scale-down only
    claims less: running jobs finish."""
    if concurrency is not None and (
        isinstance(concurrency, bool)
        or not isinstance(concurrency, int)
        or not 1 <= concurrency <= MAX_SCALE
    ):
        raise InvalidArgument(
            f"concurrency must be a whole number from 1 to {MAX_SCALE}, not {concurrency!r}"
        )
    FlowStore(store).scale(name, concurrency)


def type_settings(store: Store, name: str) -> FlowSettings:
    """A type's pause (since when) and `hivejobs scale`, as the pools read them."""
    return FlowStore(store).settings(name)


def paused_types(store: Store) -> list[str]:
    return [p.name for p in FlowStore(store).paused()]
