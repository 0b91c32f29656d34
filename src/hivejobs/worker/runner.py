"""Runner threads of a pool process: each takes a reserved claim, runs it through the
executor and hands the Completion to the completer.

Never writes to Postgres itself except a chain try's captured output (before the try's
completion, so the output is there once the try's log row is); never submits a result the
watchdog or the shutdown already answered for (Running.abandoned).
"""

from __future__ import annotations

import threading
import time

import psycopg
from loguru import logger

from hivejobs.broker import Broker
from hivejobs.config import Settings
from hivejobs.failpoints import failpoint
from hivejobs.jobtypes import JobType
from hivejobs.logs import error_fields
from hivejobs.metrics import Recorder
from hivejobs.records.jobs import ClaimedJob, Completion
from hivejobs.store import Store
from hivejobs.store.chains import ChainStore, looks_like_try_id
from hivejobs.worker.capture import Captured, capturing
from hivejobs.worker.completer import Completer
from hivejobs.worker.context import AttemptContext
from hivejobs.worker.executor import execute, interrupted
from hivejobs.worker.exits import fatal_on_error
from hivejobs.worker.fetcher import Fetcher
from hivejobs.worker.served import ServedApp
from hivejobs.worker.slots import Running, Slots
from hivejobs.worker.streaming import EventSink


class Runners:
    """Owns the runner threads (`_threads`: started by the pool's start() and by scale(),
    both called from one thread at a time: run() before the fetcher starts, then the fetcher)
    and nothing they share: the slots, the claims and the completer keep their own state and
    locks. A runner ends when Slots.close() hands it None.

    With `threads=False` (an `async def` type: worker/tasks.py takes its jobs) it starts no
    runner thread and only lends its one-job path (run_one) to the threads of suspects."""

    def __init__(
        self,
        app: ServedApp,
        jt: JobType,
        settings: Settings,
        store: Store,
        broker: Broker,
        metrics: Recorder,
        slots: Slots,
        fetcher: Fetcher,
        completer: Completer,
        draining: threading.Event,
        *,
        threads: bool = True,
    ) -> None:
        self.app = app
        self.threads = threads
        self.jt = jt
        self.settings = settings
        self.store = store
        self.broker = broker
        self.metrics = metrics
        self.slots = slots
        self.fetcher = fetcher
        self.completer = completer
        self.draining = draining  # Stop.draining
        self.log = logger.bind(pool=jt.name)
        self.chains = ChainStore(store)  # stateless: one for every attempt's context
        self.events = EventSink(store, broker)  # ctx.progress / ctx.emit of this lane's jobs
        self._threads: list[threading.Thread] = []

    @property
    def count(self) -> int:
        """Runner threads started (idle extras of a scale-down included)."""
        return len(self._threads)

    def start(self) -> None:
        for _ in range(self.jt.concurrency if self.threads else 0):
            self._new_runner()

    def scale(self, concurrency: int) -> bool:
        """`hivejobs scale`: the claim room follows `concurrency` at once; more
        runner threads start when it grows. When it shrinks the extra runners stay, idle:
        fewer claims are made, and no running job is interrupted. False: no change."""
        with self.slots.cond:
            before = self.slots.concurrency
            if concurrency == before:
                return False
            self.slots.concurrency = concurrency
            self.slots.cond.notify_all()
        while self.threads and len(self._threads) < concurrency:
            self._new_runner()
        self.log.info("concurrency scaled", concurrency=concurrency, before=before)
        return True

    def _new_runner(self) -> None:
        name = f"runner-{len(self._threads)}"
        thread = threading.Thread(target=fatal_on_error(self._run), name=name, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _run(self) -> None:
        while True:
            with self.slots.take() as job:
                if job is None:
                    return
                self.run_one(job)

    def run_one(self, job: ClaimedJob) -> None:
        """Run `job` in this thread if it may start, else hand it back. A job no process died
        under (nearly all) is checked and started under one lock (Slots.start_if_may); a
        suspect runs inside its turn in quarantine (Slots.turn)."""
        if not self.draining.is_set():
            if job.lost == 0:
                ctx = self.app.job_context(job, self.chains, self.events)
                entry = self.slots.start_if_may(job, ctx)
                if entry is not None:
                    self._run_started(job, ctx, entry)
                    return
            else:
                with self.slots.turn(job, self.fetcher.claims.held, self.hand_back) as may_start:
                    if may_start:
                        ctx = self.app.job_context(job, self.chains, self.events)
                        self._run_started(job, ctx, self.slots.started(job, ctx))
                        return
        self.hand_back(job)

    def hand_back(self, job: ClaimedJob) -> None:
        """Not started (stopping, or giving way to a suspect): back to the queue, uncounted."""
        max_bytes = self.settings.max_result_bytes
        self.completer.submit(interrupted(job, started=False, max_result_bytes=max_bytes))

    def _run_started(self, job: ClaimedJob, ctx: AttemptContext, entry: Running) -> None:
        began = time.monotonic()
        if looks_like_try_id(job.id):  # a chain try: its output goes to the job log
            with capturing(self.settings.job_log_output_bytes) as output:
                completion = self._execute(job, ctx)
            self.keep_output(job, output)
        else:
            completion = self._execute(job, ctx)
        self.events.finish(job.id)  # its last progress stored before its end is
        self.metrics.observe("run", job.name, time.monotonic() - began)
        if self.slots.finished(entry):
            failpoint("pool.before_completion_commit")
            self.completer.submit(completion)

    def _execute(self, job: ClaimedJob, ctx: AttemptContext) -> Completion:
        started = time.monotonic()
        completion = execute(
            self.jt,
            job,
            ctx,
            max_result_bytes=self.settings.max_result_bytes,
            shutting_down=self.draining.is_set,
        )
        if completion.outcome == "succeeded":
            self.fetcher.note_run(time.monotonic() - started)
        return completion

    def keep_output(self, job: ClaimedJob, output: Captured) -> None:
        """Before the completion, so the output is there once the try's log row is."""
        if output.empty:
            return
        try:
            self.chains.save_output(
                job.id, output.stdout.text(), output.stderr.text(), output.truncated
            )
        except psycopg.Error as exc:
            # The job log loses this output; the try's outcome is unaffected.
            self.log.warning("captured output not stored", job_id=job.id, **error_fields(exc))
