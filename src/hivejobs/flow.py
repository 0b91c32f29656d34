"""Flow control of job types (issue 12): pause/resume and fleet-wide limits.

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
- rate: a token bucket in the same row, refilled on the database clock under the same lock;
- limit_by: `global_concurrency` per distinct value of one payload field (at most N running
  per customer, say). The partition is read from the payload in the claim, under the same
  lock: the running rows are counted per partition (`choose` picks the ids whose partition
  has room), so the slots are still the running rows and a dead holder's come back the same
  way. Ids refused because their partition is full go to the tail of their list, so a full
  partition never blocks the others, and a pool that claimed none of them waits for a slot
  (SLOT_POLL_S, sooner on its own completions) before it pops again: no hot spin.

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
from hivejobs.records import ClaimedJob
from hivejobs.store import Conn, Store
from hivejobs.store.flow import FlowState, FlowStore, LimitBy, Room

PAUSE_POLL_S = 1.0  # a paused type's pools look again this often (resume takes up to this)
SLOT_POLL_S = 0.1  # a full type's pools look again this often (sooner on their own completions)
MAX_SCALE = 1000  # threads per pool process `hivejobs scale` may ask for
MAX_RATE_WAIT_S = 1.0  # a rate-limited pool re-reads the bucket at least this often
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
    if global_concurrency is None:
        raise InvalidJobType(
            "limit_by needs global_concurrency (limit_by=... caps the running jobs per value "
            "of that payload field at global_concurrency)"
        )
    if rate is not None:
        # Per-partition token buckets are not built yet: refuse rather than apply the rate
        # to the whole type while the caller believes it is per partition.
        raise InvalidJobType(
            "limit_by does not partition rate yet: drop rate=, or limit_by= and keep a "
            "type-wide rate on a job type of its own"
        )


def choose(
    candidates: list[tuple[str, str]], running: dict[str, int], per_partition: int, want: int
) -> list[str]:
    """Of (id, partition) candidates in pop order, the ids to claim: at most `want`, and no
    partition beyond `per_partition` running jobs counting these. Pure: tested with tables
    (tests/unit/test_flow.py)."""
    taken = dict(running)
    chosen: list[str] = []
    for job_id, part in candidates:
        if len(chosen) >= want:
            break
        if taken.get(part, 0) < per_partition:
            taken[part] = taken.get(part, 0) + 1
            chosen.append(job_id)
    return chosen


def decide(limits: Limits | None, want: int, state: FlowState) -> Room:
    """How many of `want` jobs may start now, else how long to wait. Pure: tested with a
    table of states (tests/unit/test_flow.py)."""
    if state.paused:
        return Room(allowed=0, wait_s=PAUSE_POLL_S, tokens=None)
    allowed, wait_s, tokens = want, 0.0, None
    if limits is not None and limits.global_concurrency is not None and limits.limit_by is None:
        # With limit_by the bound is per partition: only the claim (choose) knows which.
        free = max(0, limits.global_concurrency - state.running)
        allowed = min(allowed, free)
        if free == 0:
            wait_s = SLOT_POLL_S
    if limits is not None and limits.rate_per_s is not None:
        tokens = min(float(limits.burst), state.tokens + state.since_s * limits.rate_per_s)
        whole = max(0, math.floor(tokens + 1e-9))
        allowed = min(allowed, whole)
        if whole == 0:
            wait_s = max(wait_s, min(MAX_RATE_WAIT_S, (1.0 - tokens) / limits.rate_per_s))
    return Room(allowed=max(0, allowed), wait_s=wait_s if allowed <= 0 else 0.0, tokens=tokens)


class Flow:
    """One pool's view of its type's flow control.

    Owns the cached pause state of an unlimited type (`_paused`, `_checked_at`), read and
    written by the fetcher thread alone, so no lock. The cache only spares a query per pop:
    the claim itself checks the pause, so a stale cache costs a bounce, never a start.
    """

    def __init__(self, store: Store, broker: Broker, name: str, limits: Limits | None) -> None:
        self.flows = FlowStore(store)
        self.store = store
        self.broker = broker
        self.name = name
        self.limits = limits
        self._paused = False
        self._checked_at = -math.inf
        self._ensured = False  # a limited type's flow row exists (made at the first look)
        self.concurrency: int | None = None  # `hivejobs scale` (None: the type's own)

    def room(self, want: int) -> Room:
        """Before a pop: how many ids to pop, or how long to wait first."""
        if self.limits is None:
            now = time.monotonic()
            if now - self._checked_at >= PAUSE_POLL_S:
                self._paused, self.concurrency = self.flows.pool_settings(self.name)
                self._checked_at = now
            if self._paused:
                return Room(allowed=0, wait_s=PAUSE_POLL_S, tokens=None)
            return Room(allowed=want, wait_s=0.0, tokens=None)
        if not self._ensured:
            self.flows.ensure(self.name)
            self._ensured = True
        state = self.flows.state(self.name)
        if state is None:  # row deleted by hand: made again, limits hold from the next claim
            self._ensured = False
            return Room(allowed=0, wait_s=SLOT_POLL_S, tokens=None)
        self.concurrency = state.concurrency
        return decide(self.limits, want, state)

    def claim(self, conn: Conn, ids: list[str], worker_id: str) -> list[ClaimedJob]:
        """The claim, atomic with the limits: under the type's lock when it has any."""
        if self.limits is None:
            return self.store.claim_queued(ids, worker_id, conn, name=self.name)
        limits = self.limits
        by = None
        if limits.limit_by is not None and limits.global_concurrency is not None:
            per = limits.global_concurrency
            by = LimitBy(field=limits.limit_by, pick=lambda c, r, n: choose(c, r, per, n))
        return self.flows.claim_limited(
            conn, ids, worker_id, self.name, lambda s: decide(limits, len(ids), s), by
        )

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
        return SLOT_POLL_S if not claimed else 0.0


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


def paused_types(store: Store) -> list[str]:
    return [p.name for p in FlowStore(store).paused()]
