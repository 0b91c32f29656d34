"""Tasks of a pool process: an `async def` type's claims run as tasks on the process's one
event loop, at most `concurrency` at once, with no thread per job.

The fetcher hands claims over (Slots.hand_over) and wakes the loop once per hand-over; the
loop starts a task for each waiting claim while fewer than `concurrency` run. The tasks that
end within one turn of the loop are settled together in the next (_settle): their runs
forgotten, their Completions handed to the completer and their slots freed, each with one
lock taken for all of them, and the tasks their slots make room for started: short jobs cost
one hand-off to the completer's thread and one wake-up of the fetcher per turn, not per
job. A stop request (shutdown, cancel, timeout) reaches the handler as the cancellation of
its task (executor.execute_async). A suspect (a job whose process died under it) must wait
until it runs alone, which blocks: it gets a thread of its own, as a `def` handler's job
would.

Never blocks the loop on purpose (a chain try's captured output is written from a worker
thread), never runs a job the slots say may not start, and never submits a result the
watchdog or the shutdown already answered for (Running.abandoned).
"""

from __future__ import annotations

import asyncio
import functools
import os
import threading
import time

from loguru import logger

from hivejobs.failpoints import failpoint
from hivejobs.records.jobs import ClaimedJob, Completion
from hivejobs.store.chains import looks_like_try_id
from hivejobs.worker.async_handlers import process_loop
from hivejobs.worker.capture import capturing
from hivejobs.worker.context import AttemptContext
from hivejobs.worker.executor import execute_async
from hivejobs.worker.exits import ChildExit, fatal_on_error
from hivejobs.worker.runner import Runners
from hivejobs.worker.slots import Running


class Tasks:
    """Owns the tasks of one async lane: `_running` (tasks started and not yet settled),
    `_tasks` (a reference to each, so none is collected while it runs) and `_ended` (the
    attempts ended since the last _settle, each its run and Completion, or None for a claim
    handed back), all touched on the loop's thread only, so they need no lock. A slot
    is freed only once its Completion is with the completer (in _settle, in that order): the
    shutdown, which waits for the runs to end and then for the completer, never sees an
    attempt ended whose Completion is nowhere. Shares the lane's slots (their own lock) and
    borrows the lane's Runners for what is not the loop's: a suspect's thread, the hand-back
    of a claim that may not start, a chain try's output. Keeps `_running <= concurrency`
    except while a scale-down lets the running ones end."""

    def __init__(self, runners: Runners) -> None:
        self.runners = runners
        self.slots = runners.slots
        self.jt = runners.jt
        self.loop, self.loop_thread = process_loop()
        self._running = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._ended: list[tuple[Running, Completion] | None] = []
        self.log = logger.bind(pool=self.jt.name)

    @property
    def count(self) -> int:
        """Runner threads to end at close(): none, a task ends with its job."""
        return 0

    @property
    def busy(self) -> bool:
        """Whether a task of this lane runs now (read from any thread: an int)."""
        return self._running > 0

    def start(self) -> None:
        self.wake()

    def wake(self) -> None:
        """Claims were handed over (any thread): the loop starts what it may."""
        self.loop.call_soon_threadsafe(self._pump)

    def scale(self, concurrency: int) -> bool:
        """`hivejobs scale`: the claim room and the task limit follow `concurrency` at once;
        a scale-down interrupts nothing (the running tasks end as they would)."""
        changed = self.runners.scale(concurrency)
        if changed:
            self.wake()
        return changed

    def _pump(self) -> None:
        """Start a task per waiting claim while there is room (the loop's thread)."""
        slots = self.slots
        while self._running < slots.concurrency:
            job = slots.next_nowait()
            if job is None:
                return
            if job.lost:
                # It waits, blocking, until this process holds no other claim: not here.
                thread = threading.Thread(
                    target=fatal_on_error(functools.partial(self._suspect, job)),
                    name="suspect",
                    daemon=True,
                )
                thread.start()
                continue
            self._running += 1
            task = self.loop.create_task(self._attempt(job))
            self._tasks.add(task)

    def _suspect(self, job: ClaimedJob) -> None:
        try:
            self.runners.run_one(job)  # its handler's task runs on the loop; this thread waits
        finally:
            self.slots.release()
            self.wake()

    async def _attempt(self, job: ClaimedJob) -> None:
        try:
            runners = self.runners
            ctx = runners.app.job_context(job, runners.chains, runners.events)
            entry = self.slots.start_if_may(job, ctx)
            if entry is None:
                runners.hand_back(job)
                self._end(None)
            else:
                self._end(await self._run_started(job, ctx, entry))
        except BaseException as exc:
            # A bug in our own bookkeeping (the handler's errors are its attempt's): the
            # claim would stay unfinished while the heartbeat says all is well. As
            # fatal_on_error.
            logger.opt(exception=exc).critical("pool task crashed: exiting the process")
            os._exit(ChildExit.THREAD_CRASHED)
        finally:
            task = asyncio.current_task()
            if task is not None:
                self._tasks.discard(task)

    def _end(self, ended: tuple[Running, Completion] | None) -> None:
        """An attempt ended (None: its claim was handed back): settled in the loop's next
        turn, with the others that end before it."""
        if not self._ended:
            self.loop.call_soon(self._settle)
        self._ended.append(ended)

    def _settle(self) -> None:
        try:
            ended, self._ended = self._ended, []
            runs = [e for e in ended if e is not None]
            wanted = self.slots.finished_many([entry for entry, _ in runs])
            # Not for one the watchdog or the shutdown answered for meanwhile (abandoned).
            completions = [c for (_, c), keep in zip(runs, wanted, strict=True) if keep]
            for _ in completions:
                failpoint("pool.before_completion_commit")
            if completions:
                self.runners.completer.submit_many(completions)
            self.slots.release(len(ended))
            self._running -= len(ended)
            self._pump()
        except BaseException as exc:  # as in _attempt: our bookkeeping, never a handler's
            logger.opt(exception=exc).critical("pool task crashed: exiting the process")
            os._exit(ChildExit.THREAD_CRASHED)

    async def _run_started(
        self, job: ClaimedJob, ctx: AttemptContext, entry: Running
    ) -> tuple[Running, Completion]:
        runners = self.runners
        began = time.monotonic()
        if looks_like_try_id(job.id):  # a chain try: its output goes to the job log
            with capturing(runners.settings.job_log_output_bytes) as output:
                completion = await self._execute(job, ctx)
            await asyncio.to_thread(runners.keep_output, job, output)
        else:
            completion = await self._execute(job, ctx)
        if runners.events.reported(job.id):  # its last progress stored before its end is
            await asyncio.to_thread(runners.events.finish, job.id)
        runners.metrics.observe("run", job.name, time.monotonic() - began)
        return entry, completion

    async def _execute(self, job: ClaimedJob, ctx: AttemptContext) -> Completion:
        runners = self.runners
        started = time.monotonic()
        completion = await execute_async(
            self.jt,
            job,
            ctx,
            max_result_bytes=runners.settings.max_result_bytes,
            shutting_down=runners.draining.is_set,
        )
        if completion.outcome == "succeeded":
            runners.fetcher.note_run(time.monotonic() - started)
        return completion
