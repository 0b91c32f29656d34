"""Runner slots of a pool process: the claims handed to runners, the attempts running, and
the quarantine of suspects (jobs whose process died under them before).

Never runs anything itself; never releases a slot twice: a slot is taken by `hand_over` and
released when the `take()` or `drain()` block that took its job ends, and nowhere else.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from hivejobs.records.jobs import ClaimedJob
from hivejobs.worker.context import AttemptContext


@dataclass
class Running:
    """One attempt in a runner thread. `abandoned` (guarded by Slots.cond) is set once, by
    the watchdog or the shutdown, when they end the attempt themselves: the runner's result
    is then dropped, so that only one completion is ever written for the claim."""

    job: ClaimedJob
    ctx: AttemptContext
    started: float = field(default_factory=time.monotonic)
    abandoned: bool = False


class Slots:
    """Owns the pool's one condition, `cond`, and what it guards:

    - `reserved`: claims handed over and not yet done running (waiting or running). The
      fetcher keeps it within its claim room; a runner's `take()` block releases one.
    - `running`: job id -> Running, the attempts in runner threads (and each `abandoned`).
    - `isolating`: a suspect waits to run alone; no other job starts meanwhile.
    - `concurrency`: the runners wanted (`hivejobs scale` changes it, Runners.scale): the
      fetcher's claim room follows it.
    - the fetcher's `Claims.held` map: claim room depends on both sides, and whoever frees
      room notifies `cond`, on which the fetcher waits for room and a suspect for its turn.

    `_isolation` (a plain lock, never held with `cond` waited on) lets one suspect at a time
    into quarantine. The work queue needs no lock (a SimpleQueue).
    """

    def __init__(
        self,
        draining: threading.Event,
        concurrency: int,
        room_open: Callable[[], bool],
        handed_over: Callable[[], None] | None = None,
    ) -> None:
        """`room_open`: whether the fetcher's claim room is open now (Fetcher.room_open, the
        fetcher makes its slots), called with `cond` held: a freed slot wakes the waiters on
        `cond` only then, or for a suspect or a drain (see _release). `handed_over`: called
        after each hand_over, for takers that do not block on the work queue (Tasks)."""
        self.cond = threading.Condition()
        self.reserved = 0
        self.concurrency = concurrency
        self.running: dict[str, Running] = {}
        self.isolating = False
        self._isolation = threading.Lock()
        self._draining = draining  # Stop.draining: start nothing new
        self._work: queue.SimpleQueue[ClaimedJob | None] = queue.SimpleQueue()
        self._room_open = room_open
        self._handed_over = handed_over

    # -- reservation ---------------------------------------------------------------------

    def hand_over(self, jobs: list[ClaimedJob]) -> None:
        """Reserve one slot per claimed job and queue the jobs for the runners."""
        with self.cond:
            self.reserved += len(jobs)
        for job in jobs:
            self._work.put(job)
        if self._handed_over is not None:
            self._handed_over()

    @contextmanager
    def take(self) -> Iterator[ClaimedJob | None]:
        """A runner's next job (blocking); its slot is released when the block ends. None
        tells the runner to end (close())."""
        job = self._work.get()
        if job is None:
            yield None
            return
        try:
            yield job
        finally:
            self._release()

    def next_nowait(self) -> ClaimedJob | None:
        """The next job handed over, or None if none waits (never blocks): for a taker that
        runs jobs as tasks; it calls release() once the job is done (run or handed back)."""
        while True:
            try:
                job = self._work.get_nowait()
            except queue.Empty:
                return None
            if job is not None:
                return job

    def release(self, count: int = 1) -> None:
        """The slots of `count` jobs from next_nowait() are free."""
        self._release(count)

    def drain(self) -> Iterator[ClaimedJob]:
        """Jobs handed over that no runner took; each slot is released after the caller's
        loop body has dealt with its job."""
        while True:
            try:
                job = self._work.get_nowait()
            except queue.Empty:
                return
            if job is None:
                self._work.put(None)  # a runner's end (close()): not the drain's to take
                return
            try:
                yield job
            finally:
                self._release()

    def close(self, runners: int) -> None:
        """End `runners` runner threads once they are idle."""
        for _ in range(runners):
            self._work.put(None)

    def _release(self, count: int = 1) -> None:
        """Free a slot; wake the waiters on `cond` only when one of them can act on it: the
        fetcher once it may claim (not for every finished job while the jobs claimed ahead
        still wait: that would be one wasted thread wake-up per job), a suspect waiting for its
        neighbours to end, or the shutdown waiting for the running ones."""
        with self.cond:
            self.reserved -= count
            if self.wanted():
                self.cond.notify_all()

    def wanted(self) -> bool:
        """Whether freed room (a slot, or a claim written: Claims.forget) is worth waking the
        waiters on `cond` for; called with `cond` held."""
        return self.isolating or self._draining.is_set() or self._room_open()

    # -- running -------------------------------------------------------------------------

    def started(self, job: ClaimedJob, ctx: AttemptContext) -> Running:
        entry = Running(job, ctx)
        with self.cond:
            self.running[job.id] = entry
        return entry

    def start_if_may(self, job: ClaimedJob, ctx: AttemptContext) -> Running | None:
        """may_start() and started() under one lock (a job's start in either lane): None
        when the job may not start; else it runs, and a drain beginning now finds it."""
        with self.cond:
            if self.isolating or self._draining.is_set():
                return None
            entry = self.running[job.id] = Running(job, ctx)
            return entry

    def finished(self, entry: Running) -> bool:
        """Forget a finished attempt; True when its result is still wanted (not abandoned)."""
        with self.cond:
            self.running.pop(entry.job.id, None)
            return not entry.abandoned

    def finished_many(self, entries: list[Running]) -> list[bool]:
        """finished() for each of `entries`, under one lock."""
        with self.cond:
            for entry in entries:
                self.running.pop(entry.job.id, None)
            return [not entry.abandoned for entry in entries]

    def abandon_running(self) -> list[Running]:
        """Take over every attempt still running (the shutdown suspends them)."""
        with self.cond:
            stragglers = [r for r in self.running.values() if not r.abandoned]
            for r in stragglers:
                r.abandoned = True
        return stragglers

    def any_running(self) -> bool:
        """Whether an attempt whose result is still wanted runs; called with `cond` held."""
        return any(not r.abandoned for r in self.running.values())

    def cancel(self, job_id: str) -> None:
        """A user cancel: the attempt (if it runs here) is asked to stop, as cancelled."""
        with self.cond:
            r = self.running.get(job_id)
            if r is not None:
                r.ctx.cancelled = True
                r.ctx.request_stop()

    # -- quarantine ----------------------------------------------------------------------

    def may_start(self) -> bool:
        """Whether a job that is not a suspect may start now: not while a suspect waits to
        run alone, nor once the drain began."""
        with self.cond:
            return not self.isolating and not self._draining.is_set()

    @contextmanager
    def turn(
        self,
        job: ClaimedJob,
        held: Collection[str],
        give_way: Callable[[ClaimedJob], None],
    ) -> Iterator[bool]:
        """Whether `job` may start now (False: hand it back, uncounted).

        A job whose process died before (`lost`) runs alone, so a poison pill cannot take
        innocent neighbours down with it again (their deaths would count against them). One
        suspect at a time; it waits until this process holds no other claim in Postgres
        (`held`, the fetcher's map, read under `cond`): neighbours give way and their
        release must be committed, so that a death now is charged to the suspect alone.
        The suspect's runner hands back the neighbours no runner took yet (`give_way`): in a
        pool of one runner it is the only runner there is, and nobody else would.
        """
        if job.lost == 0:
            yield self.may_start()
            return
        if not self._isolation.acquire(blocking=False):
            yield False  # another suspect runs: give way
            return
        try:
            yield self._alone(job.id, held, give_way)
        finally:
            with self.cond:
                self.isolating = False
                self.cond.notify_all()
            self._isolation.release()

    def _alone(
        self, suspect_id: str, held: Collection[str], give_way: Callable[[ClaimedJob], None]
    ) -> bool:
        with self.cond:
            self.isolating = True  # the fetcher claims nothing more meanwhile (claim room)
        while not self._draining.is_set():
            # Outside `cond`: handing back submits to the completer. A claim the fetcher had
            # in flight when isolation began lands in the queue later: the next turn of
            # this loop hands it back.
            for waiting in self.drain():
                give_way(waiting)
            with self.cond:
                others = [
                    i
                    for i in held
                    if i != suspect_id and not (i in self.running and self.running[i].abandoned)
                ]
                if not others:
                    return True
                self.cond.wait(0.1)
        return False
