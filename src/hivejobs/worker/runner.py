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

from hivejobs.app import App
from hivejobs.broker import Broker
from hivejobs.capture import Captured, capturing
from hivejobs.config import Settings
from hivejobs.context import JobContext
from hivejobs.failpoints import failpoint
from hivejobs.jobtypes import JobType
from hivejobs.logs import error_fields
from hivejobs.metrics import Recorder
from hivejobs.records import ClaimedJob, Completion
from hivejobs.store import Store
from hivejobs.store.chains import ChainStore, looks_like_try_id
from hivejobs.worker.completer import Completer
from hivejobs.worker.executor import execute, interrupted
from hivejobs.worker.exits import fatal_on_error
from hivejobs.worker.fetcher import Fetcher
from hivejobs.worker.slots import Slots


class Runners:
    """Owns the `concurrency` runner threads and nothing they share: the slots, the claims
    and the completer keep their own state and locks. A runner ends when Slots.close()
    hands it None."""

    def __init__(
        self,
        app: App,
        jt: JobType,
        settings: Settings,
        store: Store,
        broker: Broker,
        metrics: Recorder,
        slots: Slots,
        fetcher: Fetcher,
        completer: Completer,
        draining: threading.Event,
    ) -> None:
        self.app = app
        self.jt = jt
        self.settings = settings
        self.store = store
        self.broker = broker
        self.metrics = metrics
        self.slots = slots
        self.fetcher = fetcher
        self.completer = completer
        self._draining = draining  # Stop.draining
        self.log = logger.bind(pool=jt.name)
        self._threads = [
            threading.Thread(target=fatal_on_error(self._run), name=f"runner-{i}", daemon=True)
            for i in range(jt.concurrency)
        ]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def _run(self) -> None:
        while True:
            with self.slots.take() as job:
                if job is None:
                    return
                self._run_one(job)

    def _run_one(self, job: ClaimedJob) -> None:
        if not self._draining.is_set():
            with self.slots.turn(job, self.fetcher.claims.held) as may_start:
                if may_start:
                    self._run_started(job)
                    return
        self._hand_back(job)

    def _hand_back(self, job: ClaimedJob) -> None:
        """Not started (stopping, or giving way to a suspect): back to the queue, uncounted."""
        max_bytes = self.settings.max_result_bytes
        self.completer.submit(interrupted(job, started=False, max_result_bytes=max_bytes))

    def _run_started(self, job: ClaimedJob) -> None:
        ctx = JobContext(job, self.app, ChainStore(self.store))
        entry = self.slots.started(job, ctx)
        began = time.monotonic()
        if looks_like_try_id(job.id):  # a chain try: its output goes to the job log
            with capturing(self.settings.job_log_output_bytes) as output:
                completion = self._execute(job, ctx)
            self._keep_output(job, output)
        else:
            completion = self._execute(job, ctx)
        self.metrics.observe("run", job.name, time.monotonic() - began)
        if self.slots.finished(entry):
            failpoint("pool.before_completion_commit")
            self.completer.submit(completion)

    def _execute(self, job: ClaimedJob, ctx: JobContext) -> Completion:
        started = time.monotonic()
        completion = execute(
            self.jt,
            job,
            ctx,
            max_result_bytes=self.settings.max_result_bytes,
            shutting_down=self._draining.is_set,
        )
        if completion.outcome == "succeeded":
            self.fetcher.note_run(time.monotonic() - started)
        return completion

    def _keep_output(self, job: ClaimedJob, output: Captured) -> None:
        """Before the completion, so the output is there once the try's log row is."""
        if output.empty:
            return
        try:
            ChainStore(self.store).save_output(
                job.id, output.stdout.text(), output.stderr.text(), output.truncated
            )
        except psycopg.Error as exc:
            # The job log loses this output; the try's outcome is unaffected.
            self.log.warning("captured output not stored", job_id=job.id, **error_fields(exc))
