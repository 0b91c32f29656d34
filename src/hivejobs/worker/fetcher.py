"""The fetcher of a pool process: pop ids from Redis, claim them in Postgres, hand them to
the runner slots; and the map of claims this process holds.

One pop takes as many ids as there are free slots (one BLMPOP), one UPDATE claims them by
primary key. Never claims a job of another type (the claim matches our type), never claims
while this process cannot prove it is alive, and never lets claims run ahead of a lagging
completer (claim_room: backpressure).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import psycopg
import redis
from loguru import logger

from hivejobs.broker import Broker, Popped
from hivejobs.broker.fair import FairQueue
from hivejobs.config import Settings
from hivejobs.failpoints import failpoint
from hivejobs.flow import Flow
from hivejobs.jobtypes import JobType
from hivejobs.logs import error_fields
from hivejobs.metrics import Recorder
from hivejobs.records.dispatch import HeldClaim
from hivejobs.records.jobs import Completion
from hivejobs.store import Store
from hivejobs.store.fair import FairStore
from hivejobs.worker.exits import fatal_on_error
from hivejobs.worker.slots import Slots

PREFETCH = 64
# Claims ahead (beyond `concurrency`) cover about this much of the pool's work, at most
# PREFETCH: every claim is a statement and a commit, so a fetcher that claims for
# each idle runner pays one per job once runners free one at a time (10 ms jobs: 1.5 ids per
# claim, the commits cost Postgres more than the jobs' rows). A claimed job then waits about
# this long for its runner at most, so a pool that dies leaves only that much work behind to
# be charged a worker loss; jobs slower than concurrency x CLAIM_AHEAD_S get no claims ahead.
# 0.08 s: with 0.04, 10 ms CPU-bound jobs (~130 a second per process on 2 cores) were claimed
# 11 at a time and their pools' Postgres CPU was 0.09-0.106 ms a job; at 0.08, 17 and
# 0.08-0.10 (4 interleaved pairs, 0.006-0.019 less each). Jobs under ~5 ms are at PREFETCH
# either way, so a dying pool still leaves at most PREFETCH claimed jobs unstarted.
CLAIM_AHEAD_S = 0.08
# Refill once the claimed jobs no runner has started fall to half the claims ahead, not as
# soon as one slot frees: with a 0.1 ms body a fetcher woken by every finished job claimed
# 17-21 ids per pop and claim; refilled from here it claims about half the claims ahead at
# a time, while the jobs still waiting keep the runners busy during the pop and claim (32
# jobs of 0.1-1 ms across 8 runners: 0.4-4 ms).
MSG_FOREIGN_ID = (
    "foreign job id dropped: a job of another type was in this pool's list (logged once per"
    " list; counted in foreign_ids)"
)
# Backpressure: finished attempts whose completion is not yet written, per runner
# thread, that a pool may hold beside a full set of claims in hand. A runner slot frees when
# a job finishes running, not when its completion is written, so without this bound a lagging
# completer let claims run far ahead: rows stood `running` by the ten thousand, and finished
# work that lives only in this process's memory is lost work if it dies.
UNWRITTEN_PER_RUNNER = 2


class Claims:
    """The claims this process holds in Postgres and has not seen written: id -> claim token
    (waiting, running, or finished and not yet written).

    `held` is guarded by the slots' condition (`slots.cond`): the claim room reads it with
    the slots' counters. `lock` (the claim lock) is held around each claim statement and its
    addition to `held`, and around the liveness check that compares `held` with Postgres, so
    that check never sees a claim committed but not yet added. Lock order: `lock`, then
    `slots.cond`; never the other way.
    """

    def __init__(self, slots: Slots) -> None:
        self.held: dict[str, int] = {}
        self.lock = threading.Lock()
        self._slots = slots

    def forget(self, written: list[Completion]) -> None:
        """The completer wrote these (or let them go): they no longer count, room frees; the
        waiters on `slots.cond` are woken when one of them can act on it (Slots.wanted)."""
        slots = self._slots
        with slots.cond:
            for c in written:
                if self.held.get(c.id) == c.claim_token:
                    del self.held[c.id]
            if slots.wanted():
                slots.cond.notify_all()

    def untracked(self, read: Callable[[], list[HeldClaim]]) -> list[HeldClaim]:
        """Claims that Postgres says we hold (`read`) and we do not."""
        with self.lock:
            rows = read()
            with self._slots.cond:
                return [row for row in rows if self.held.get(row.id) != row.claim_token]


class Fetcher:
    """Owns the fetcher thread, the runner slots it fills (`slots`) and the claims (`claims`),
    the claims-ahead decision and the fetch counters (`counts`, `foreign_keys`: written by the
    fetcher thread; `paused_for_completions` under `slots.cond`). `avg_run_s` is a hint
    written by runners (note_run) and read here without a lock: a float, a stale read only
    shifts the claims ahead by one pass.

    It makes its slots and claims itself, because their wake-ups follow its claim room: the
    slots get room_open at construction, the claims get the slots (one way, nothing set
    afterwards); the lane hands `slots` to the other roles."""

    def __init__(
        self,
        jt: JobType,
        worker_id: str,
        settings: Settings,
        store: Store,
        broker: Broker,
        metrics: Recorder,
        draining: threading.Event,
        acquiring_stopped: threading.Event,
        heartbeat_age_s: Callable[[], float],
        flow: Flow,
        scale: Callable[[int], bool],
        handed_over: Callable[[], None] | None = None,
    ) -> None:
        self.jt = jt
        self.worker_id = worker_id
        self.settings = settings
        self.store = store
        self.broker = broker
        self.metrics = metrics
        self._stopped = acquiring_stopped
        self._heartbeat_age_s = heartbeat_age_s
        self.flow = flow  # pause, fleet-wide limits, `hivejobs scale`
        self._scale = scale  # Runners.scale
        # Claims beyond `concurrency` (_ahead) cut statements per job; never for at-most-once
        # (a claim dying with us fails it), nor for a type with fleet-wide limits: a claim
        # waiting here holds a fleet-wide slot.
        self.may_claim_ahead = jt.delivery == "at_least_once" and jt.limits is None
        self.avg_run_s = 1.0  # pessimistic until measured
        # A finished job wakes us only when we may claim; `draining`: Stop.draining.
        # `handed_over`: Tasks.wake for an async type, whose claims wait for the event loop.
        self.slots = Slots(
            draining, jt.concurrency, room_open=self.room_open, handed_over=handed_over
        )
        self.claims = Claims(self.slots)
        # Logged at exit. foreign_ids: ids of other types found in our lists (dropped);
        # paused_for_completions: fetcher passes held back by backpressure.
        self.counts = {
            "pops": 0,
            "claim_statements": 0,
            "claimed": 0,
            "foreign_ids": 0,
            "paused_for_completions": 0,
        }
        self.foreign_keys: set[str] = set()  # lists a foreign id was found in (logged once)
        self.log = logger.bind(pool=jt.name, worker_id=worker_id)
        self._thread = threading.Thread(
            target=fatal_on_error(self._run), name="fetcher", daemon=True
        )
        # fair_by: pops go round-robin across keys (broker/fair.py); keys read from Postgres.
        self.fair: tuple[FairQueue, FairStore] | None = None
        if jt.fair is not None:
            fair_store = FairStore(store, jt.name, jt.fair.field)
            self.fair = (FairQueue(broker, jt.name, jt.fair.weights), fair_store)

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout_s: float) -> bool:
        """Wait for the fetcher thread to end (it does once acquiring stopped and its pop in
        flight returned); True if it did."""
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def note_run(self, seconds: float) -> None:
        """A succeeded attempt's run time, for the claims-ahead decision (_ahead)."""
        self.avg_run_s += (seconds - self.avg_run_s) * 0.1

    def claim_room(self) -> int:
        """How many ids the fetcher may claim now; called with `slots.cond` held.

        Two bounds. Slots: claims in hand (waiting or running) stay within concurrency, plus
        the claims ahead of at-least-once jobs (_ahead), refilled once no more than half of
        them wait for a runner. Backpressure: every claim not yet written in Postgres
        (`held`: in hand or finished and unwritten) stays within (UNWRITTEN_PER_RUNNER x
        concurrency) + the claims ahead. Every claim in hand may end up unwritten, so
        finished-but-unwritten completions never exceed that number, nor do this pool's
        `running` rows; when the completer lags, claiming stops until it writes
        (Claims.forget wakes the fetcher). With the slots full, the second bound only cuts a
        claim while more than `concurrency` completions wait to be written: a healthy
        completer writes a few at a time.
        """
        slots, unwritten = self._bounds()
        if unwritten < slots and slots > 0:
            self.counts["paused_for_completions"] += int(unwritten <= 0)
        return min(slots, unwritten)

    def room_open(self) -> bool:
        """Whether claim_room() would be positive (our slots' room_open); called with
        `slots.cond` held, by a runner freeing its slot or the completer's Claims.forget
        (they wake the fetcher only then)."""
        slots, unwritten = self._bounds()
        return slots > 0 and unwritten > 0

    def _ahead(self) -> int:
        """Claims beyond concurrency for the run time measured so far (CLAIM_AHEAD_S)."""
        if not self.may_claim_ahead:
            return 0
        covered = self.slots.concurrency * CLAIM_AHEAD_S / max(self.avg_run_s, 1e-6)
        return min(PREFETCH, int(covered))

    def _bounds(self) -> tuple[int, int]:
        """claim_room's two bounds (slots, unwritten); called with `slots.cond` held."""
        extra = self._ahead()
        reserved = self.slots.reserved
        if extra and reserved - len(self.slots.running) > extra // 2:
            slots = 0  # enough claimed jobs wait for a runner: refill in one larger claim
        else:
            slots = self.slots.concurrency + extra - reserved
        unwritten = UNWRITTEN_PER_RUNNER * self.slots.concurrency + extra - len(self.claims.held)
        return slots, unwritten

    def _run(self) -> None:
        backoff = 0.05
        cond = self.slots.cond
        while not self._stopped.is_set():
            with cond:
                free = self.claim_room()
                full = free <= 0 or self.slots.isolating
                if full:
                    cond.wait(0.5)
            if full:
                self._follow_scale()
                continue
            try:
                # Flow control: a paused or fleet-limited type waits here, its ids
                # left in Redis; own completions (Claims.forget) end a wait for a slot early.
                room = self.flow.room(free)
                if self._scale(self.flow.concurrency or self.jt.concurrency):
                    continue  # `free` was counted for the old concurrency
                if room.allowed <= 0:
                    with cond:
                        cond.wait(room.wait_s)
                    continue
                if self._heartbeat_age_s() > self.settings.stuck_after_s / 2:
                    # We cannot prove we are alive: claims made now could be rescued under
                    # us. Checked after flow.room(), right before the pop: room() reads
                    # Postgres and may block for as long as Postgres is unreachable, so a
                    # check made before it may be long stale by the time we pop and claim.
                    self._stopped.wait(0.2)
                    continue
                popped = self._pop(room.allowed)
                self.counts["pops"] += 1
                if popped.ids and (wait_s := self._claim(popped)) > 0:
                    with cond:  # limit_by: only full partitions' ids were popped
                        cond.wait(wait_s)
                backoff = 0.05
            except (redis.RedisError, psycopg.Error) as exc:
                self.log.warning(
                    "fetch failed, retrying",
                    keys=self.broker.queue_keys_glob(self.jt.name),
                    retry_in_s=backoff,
                    **error_fields(exc),
                )
                self._stopped.wait(backoff)
                backoff = min(backoff * 2, 2.0)

    def _pop(self, count: int) -> Popped:
        if self.fair is None:
            return self.broker.pop(self.jt.name, count)
        queue, fair_store = self.fair
        return queue.pop(count, fair_store.keys_of)

    def _follow_scale(self) -> None:
        """With no room the loop never reaches flow.room(): a scale-up must still start
        runners at once (one primary-key read a second)."""
        try:
            self._scale(self.flow.scaled_concurrency() or self.jt.concurrency)
        except psycopg.Error as exc:  # the next pop's flow check says it at WARNING
            self.log.debug("scale not read", **error_fields(exc))

    def _claim(self, popped: Popped) -> float:
        """Claim what was popped; returns how long to wait before the next pop (flow.put_back)."""
        ids = popped.ids
        claims = self.claims
        with claims.lock:
            try:
                with self.store.connection() as conn:
                    jobs = self.flow.claim(conn, ids, self.worker_id)
            except psycopg.Error as exc:
                failure: psycopg.Error | None = exc
            else:
                failure = None
                with self.slots.cond:
                    claims.held.update((j.id, j.claim_token) for j in jobs)
                self.counts["claim_statements"] += 1
                self.counts["claimed"] += len(jobs)
        if failure is not None:
            # Outside the claim lock: the heartbeat's claim check must not wait on an outage.
            # A popped duplicate of a job we already run is ours for good: never release it.
            with self.slots.cond:
                unheld = [i for i in ids if i not in claims.held]
            self._release_ambiguous(unheld)
            raise failure
        failpoint("pool.after_claim_commit")
        self.metrics.picked_up(jobs)
        self.slots.hand_over(jobs)
        if len(jobs) == len(ids):
            return 0.0
        wait_s = self.flow.put_back(popped, jobs)  # refused by a pause or a limit
        claimed = {j.id for j in jobs}
        self._drop_foreign(popped.key, [i for i in ids if i not in claimed])
        return wait_s

    def _drop_foreign(self, key: str, unclaimed: list[str]) -> None:
        """Ids we popped but did not claim are mostly duplicates (already claimed or done);
        those of another type's live jobs were pushed into our list by mistake or malice.
        The claim never takes them (it matches our type); drop them, count them, and log the
        first of each list. Their own type's reconciler dispatches them."""
        foreign = self.store.foreign_ids(unclaimed, self.jt.name)
        if not foreign:
            return
        self.counts["foreign_ids"] += len(foreign)
        if key not in self.foreign_keys:
            self.foreign_keys.add(key)
            job_id, name = foreign[0]
            self.log.warning(
                MSG_FOREIGN_ID, key=key, job_id=job_id, job_type=name, jobs=len(foreign)
            )

    def _release_ambiguous(self, ids: list[str]) -> None:
        """The claim's COMMIT outcome is unknown: put back what we may hold but never ran."""
        for _ in range(20):
            try:
                rows = self.store.release_unstarted(ids, self.worker_id)
                self.broker.push_many(rows)
                return
            except (psycopg.Error, redis.RedisError):
                if self._stopped.wait(0.5):
                    return
