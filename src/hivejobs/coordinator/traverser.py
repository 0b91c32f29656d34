"""Traverser (leader only): the coordinator service that runs chains (spincycle's traverser
and reaper).

One pass, per chain that needs it, in one transaction under the leader lease:
  reap      finished tries (from the archive) into chain-job states and job-log rows;
  resume    a suspended chain: its stopped jobs go back to pending;
  retry     a sequence with a job failed for good, nothing of it running and retries left:
            all its jobs back to pending, the start job after retry_wait;
  run       every pending job whose predecessors all succeeded (a new try = a new job);
  finalize  when nothing runs and nothing can: succeeded, failed, or stopped;
  places    a sequenced step's place in its key's line goes when it ended for good or with
            its chain (holding the key if it failed for good under on_failure="hold").
Decisions are computed from the stored state alone, never from memory of an earlier pass,
so a coordinator killed at any point leaves a chain that the next leader traverses the same
way: no progress lost, and no try created twice (a try exists only if its pending -> running
change committed). Never runs a handler and never writes outside store.traversal.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from typing import NamedTuple

import msgspec
from loguru import logger

from hivejobs.broker import Broker
from hivejobs.broker.hints import left_to_reconciler
from hivejobs.failpoints import failpoint
from hivejobs.records.chains import ChainJobState, JobLogState
from hivejobs.records.dispatch import Lease
from hivejobs.store import Store
from hivejobs.store.chains import try_id
from hivejobs.store.traversal import (
    ChangeMode,
    JobChange,
    JobRow,
    LogRow,
    Plan,
    Snapshot,
    StaleSnapshot,
    TraversalStore,
)

BATCH = 100
_RANK: dict[ChangeMode, int] = {"keep": 0, "reap": 1, "start": 2, "reset": 3}


class TraverseResult(msgspec.Struct):
    """What one pass did over the chains it looked at."""

    chains: int = 0
    started: int = 0
    ended: int = 0
    more: bool = False  # chains left for another pass right away
    lease_lost: bool = False


class Traverser:
    """Owns the wake-ups heard since its last pass (`hints`: chains a notification named;
    `search_due`: look for chain work) and the time of its next full search. Touched only
    by the coordinator's loop thread. Hops wait on this service, so the loop calls it at
    every tick (`interval_s` 0): a pass does nothing unless woken or its search is due."""

    name = "traverse"
    interval_s = 0.0

    def __init__(
        self, store: Store, broker: Broker, batch: int = BATCH, search_every_s: float = 1.0
    ) -> None:
        self.traversal = TraversalStore(store)
        self.broker = broker
        self.batch = batch
        self.search_every_s = search_every_s
        self.search_due = True  # look for chain work at once (chains_to_traverse)
        self.hints: set[str] = set()  # chains a wake-up named: traverse just these
        self._next_search = 0.0
        self._decided: Plan | None = None  # the last plan, for logging after its commit

    def wake(self, chains: set[str], search: bool) -> None:
        """A notification named these chains (or asked for a search)."""
        self.hints |= chains
        self.search_due = self.search_due or search

    def forget(self) -> None:
        """A follower keeps no wake-ups: whenever it becomes the leader, it starts with a
        full search instead."""
        self.hints.clear()
        self.search_due = True

    @property
    def pending(self) -> bool:
        """Chain work is waiting for a pass: the loop must not sleep."""
        return self.search_due or bool(self.hints)

    def run_once(self, lease: Lease, only: set[str] | None = None) -> TraverseResult:
        """Traverse the chains that need it: every `search_every_s`, or when a wake-up asked,
        a search for them; else just the chains wake-ups named. With `only`, just those."""
        if only is None:
            now = time.monotonic()
            if self.search_due or now >= self._next_search:
                self._next_search = now + self.search_every_s
            elif self.hints:
                only = self.hints
            else:
                return TraverseResult()
            self.search_due, self.hints = False, set()
        result = self._traverse(lease, only)
        self.search_due = self.search_due or result.more
        return result

    def _traverse(self, lease: Lease, only: set[str] | None) -> TraverseResult:
        result = TraverseResult()
        ids = (
            sorted(only) if only is not None else self.traversal.chains_to_traverse(self.batch + 1)
        )
        result.more = len(ids) > self.batch
        for chain_id in ids[: self.batch]:
            self._decided = None
            try:
                pushes = self.traversal.traverse(lease, chain_id, self._plan)
            except StaleSnapshot:
                result.more = True  # changed while we planned: look again next pass
                continue
            if pushes is None:
                result.lease_lost = True
                return result
            result.chains += 1
            result.started += len(pushes)
            final = self._decided.state if self._decided is not None else None
            if final in ("succeeded", "failed", "stopped"):
                result.ended += 1
                logger.info("chain finished", chain_id=chain_id, state=final)
            failpoint("chain.after_commit_before_push")
            if pushes:
                with left_to_reconciler("chain tries", chain_id=chain_id, jobs=len(pushes)):
                    self.broker.push_many(pushes)
        return result

    def _plan(self, snapshot: Snapshot) -> Plan | None:
        self._decided = plan_chain(snapshot)
        return self._decided


class Reaped(NamedTuple):
    """What a reaped try leaves on its chain job's row (the update's `reap` mode)."""

    started_at: datetime | None = None
    finished_at: datetime | None = None
    result: bytes | None = None
    error: str | None = None


NOT_REAPED = Reaped()  # a row this pass did not reap: its update keeps the try's details


class _Draft:
    """The plan under construction: rows change in place, `was` keeps the stored state
    each update is fenced on."""

    def __init__(self, snap: Snapshot) -> None:
        self.snap = snap
        self.plan = Plan(state=snap.state)
        self.was: dict[str, ChainJobState] = {}
        self.modes: dict[str, ChangeMode] = {}
        self.reaped: dict[str, Reaped] = {}

    def touch(self, row: JobRow, mode: ChangeMode) -> None:
        """Every row touched has a mode (a resumed row that nothing else touches keeps
        "keep"); a later touch only raises it."""
        self.was.setdefault(row.key, row.state)
        current = self.modes.get(row.key)
        if current is None or _RANK[mode] > _RANK[current]:
            self.modes[row.key] = mode

    def changes(self) -> list[JobChange]:
        out = []
        for key, was in self.was.items():
            row = self.snap.jobs[key]
            reaped = self.reaped.get(key, NOT_REAPED)
            change = JobChange(
                key=key,
                was=was,
                state=row.state,
                try_=row.try_,
                total_tries=row.total_tries,
                job_id=row.job_id,
                not_before=row.not_before,
                mode=self.modes[key],
                started_at=reaped.started_at,
                finished_at=reaped.finished_at,
                result=reaped.result,
                error=reaped.error,
            )
            out.append(change)
        return out


def plan_chain(snap: Snapshot) -> Plan | None:
    """Everything one pass decides for one chain, from its stored state alone."""
    draft = _Draft(snap)
    succeeded_any = _reap(draft)
    # By what is stopped, not by the chain's state: a pool may stop a try (and mark the
    # chain suspended) while a pass that has already read the chain is committing.
    stopped = any(row.state == "stopped" for row in snap.jobs.values())
    if (stopped or snap.state == "suspended") and not snap.stop_requested:
        _resume(draft)
    if not snap.stop_requested:
        _retry_sequences(draft)
        _start_runnable(draft)
        if succeeded_any and draft.plan.tries:
            failpoint("chain.after_success_before_successor")
    _finalize(draft)
    if snap.stop_requested:
        _give_up_on_stragglers(draft)
    _end_places(draft)
    draft.plan.changes = draft.changes()
    return draft.plan


def _reap(draft: _Draft) -> bool:
    snap, succeeded_any = draft.snap, False
    for done in snap.finished:
        row = snap.jobs[done.key]
        seq_try = snap.seq_tries.get(row.seq) if row.seq else None
        draft.touch(row, "reap")
        result: bytes | None = None
        error: str | None = None
        log_state: JobLogState
        if done.state == "succeeded":
            row.state, result, log_state = "succeeded", done.result, "succeeded"
            succeeded_any = True
        elif done.state == "cancelled" and snap.stop_requested:
            # Stopping is not failing: the try is not counted (spincycle rolls it back).
            row.state, row.try_, log_state = "stopped", row.try_ - 1, "stopped"
            error = done.error
        else:
            error = done.error or f"try ended {done.state}"
            log_state = "failed"
            if row.try_ < row.tries and not snap.stop_requested:
                row.state = "pending"
                row.not_before = _after(snap, row.retry_wait_s)
            else:
                row.state = "failed"
        draft.reaped[row.key] = Reaped(done.started_at, done.finished_at, result, error)
        draft.plan.log.append(
            LogRow(
                key=row.key,
                try_=row.total_tries,
                name=row.name,
                job_id=done.id,
                seq_try=seq_try,
                state=log_state,
                started_at=done.started_at,
                finished_at=done.finished_at,
                error=error,
            )
        )
    return succeeded_any


def _resume(draft: _Draft) -> None:
    """Stopped jobs run again; their stopped tries were already uncounted when they ended."""
    for row in draft.snap.jobs.values():
        if row.state == "stopped":
            draft.touch(row, "keep")
            row.state, row.not_before = "pending", None
    draft.plan.resumed = True
    failpoint("chain.mid_resume")


def _retry_sequences(draft: _Draft) -> None:
    snap = draft.snap
    for start, (retries, wait_s) in snap.seq_limits.items():
        members = [row for row in snap.jobs.values() if row.seq == start]
        if not any(r.state == "failed" for r in members):
            continue
        if any(r.state == "running" for r in members):
            continue  # retry once the sequence's other jobs have ended
        seq_try = snap.seq_tries[start]
        if seq_try > retries:
            continue  # exhausted: the job stays failed and the chain fails
        for row in members:
            draft.touch(row, "reset")
            row.state, row.try_, row.not_before = "pending", 0, None
        snap.jobs[start].not_before = _after(snap, wait_s)
        snap.seq_tries[start] = draft.plan.seq_tries[start] = seq_try + 1
        logger.warning(
            "job failed for good: retrying its sequence",
            chain_id=snap.id,
            sequence=start,
            sequence_try=seq_try + 1,
            retry_in_s=wait_s,
        )


def _start_runnable(draft: _Draft) -> None:
    snap = draft.snap
    for row in snap.jobs.values():
        if row.state != "pending" or not _preds_succeeded(snap, row):
            continue
        if row.not_before is not None and row.not_before > snap.now:
            continue
        draft.touch(row, "start")
        row.try_ += 1
        row.total_tries += 1
        row.job_id = try_id(snap.id, row.key, row.total_tries)
        row.state, row.not_before = "running", None
        draft.plan.tries.append(row)


def _finalize(draft: _Draft) -> None:
    snap, plan = draft.snap, draft.plan
    waits = [
        row.not_before
        for row in snap.jobs.values()
        if not snap.stop_requested
        and row.state == "pending"
        and _preds_succeeded(snap, row)
        and row.not_before is not None
    ]
    running = any(row.state == "running" for row in snap.jobs.values())
    plan.wake_at = min((w for w in waits if w is not None), default=None)
    if running or waits:
        stays_suspended = snap.state == "suspended" and snap.stop_requested
        plan.state = "suspended" if stays_suspended else "running"
    elif snap.stop_requested:
        # spincycle's rule: a job that failed for good makes the chain failed, stop or not;
        # stopped means that nothing failed, the user just ended it early.
        failed = any(row.state == "failed" for row in snap.jobs.values())
        plan.state = "failed" if failed else "stopped"
    elif all(row.state == "succeeded" for row in snap.jobs.values()):
        plan.state = "succeeded"
    else:
        plan.state = "failed"  # what is still pending cannot be reached any more


def _give_up_on_stragglers(draft: _Draft) -> None:
    """spincycle's stop timeout: tries still running at `stop_by` ignored ctx.stopping; they
    are abandoned (archived cancelled, so the next pass reaps them as stopped, the error saying
    why). Before then, the chain is looked at again at `stop_by`."""
    snap, plan = draft.snap, draft.plan
    reaped = {done.key for done in snap.finished}
    running = [
        row
        for row in snap.jobs.values()
        if row.state == "running" and row.key not in reaped and row.job_id is not None
    ]
    if not running or snap.stop_by is None:
        return
    if snap.now < snap.stop_by:
        plan.wake_at = snap.stop_by
        return
    plan.abandon = [row.job_id for row in running if row.job_id is not None]
    plan.abandon_error = (
        "chain stopped: the try ignored ctx.stopping past the stop timeout and was "
        "abandoned (its handler may still be running in its pool)"
    )
    logger.warning(
        "chain stop timed out: abandoning tries that ignore ctx.stopping",
        chain_id=snap.id,
        jobs=[row.key for row in running],
    )


def _end_places(draft: _Draft) -> None:
    """A sequenced step keeps its place in its key's line while the chain may still try it
    (pending between tries, running, failed with its chain sequence's retry to come, stopped
    for a resume): a retry then runs in the first try's turn, and no later job of the key
    starts before. The place goes when the step succeeded (a try's success gives it up in
    its completion already: this is the repair), failed for good (holding the key under
    on_failure="hold", as a plain job's failure would), or when the chain ends. A stop is
    not a failure: it never holds the key."""
    snap, plan = draft.snap, draft.plan
    chain_ends = plan.state in ("succeeded", "failed", "stopped")
    for row in snap.jobs.values():
        if not row.has_place:
            continue
        if row.state == "failed" and (chain_ends or not _sequence_retries_left(snap, row)):
            plan.end_places[row.key] = row.seq_hold and not snap.stop_requested
        elif chain_ends or row.state == "succeeded":
            plan.end_places[row.key] = False


def _sequence_retries_left(snap: Snapshot, row: JobRow) -> bool:
    """A failed job's chain sequence will run it again (it waits for its other jobs)."""
    if row.seq is None or snap.stop_requested:
        return False
    return snap.seq_tries[row.seq] <= snap.seq_limits[row.seq][0]


def _preds_succeeded(snap: Snapshot, row: JobRow) -> bool:
    return all(snap.jobs[k].state == "succeeded" for k in row.after_keys)


def _after(snap: Snapshot, wait_s: float) -> datetime | None:
    """When a wait ends, on the database clock (R5, docs/concepts/reliability.md); None for
    no wait."""
    return snap.now + timedelta(seconds=wait_s) if wait_s > 0 else None
