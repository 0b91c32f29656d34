"""Pool process: one job type, `concurrency` runner threads fed by one fetcher.

The composition root of a pool process: it builds the roles (fetcher, slots, runners,
completer, watchdog, liveness, shutdown), starts their threads, watches timeouts until a
stop is asked for, then drains and says how it ended (a ChildExit). The roles keep every
rule; this file only wires them. Never runs a job it has not claimed in Postgres or a job of
another type, and never writes the end of a claim without its claim token.
"""

from __future__ import annotations

import os
import socket
import threading

import psycopg
import redis
from loguru import logger

from hivejobs.app import App
from hivejobs.broker import Broker
from hivejobs.config import Settings
from hivejobs.flow import Flow
from hivejobs.jobtypes import JobType
from hivejobs.logs import error_fields
from hivejobs.memory import MemoryCap
from hivejobs.metrics import Recorder
from hivejobs.records import Completion
from hivejobs.store import Store
from hivejobs.worker.completer import Completer
from hivejobs.worker.exits import ChildExit
from hivejobs.worker.fetcher import Fetcher
from hivejobs.worker.liveness import Liveness
from hivejobs.worker.runner import Runners
from hivejobs.worker.shutdown import Shutdown, Stop, StopReason
from hivejobs.worker.slots import Slots
from hivejobs.worker.watchdog import Watchdog

WATCH_EVERY_S = 0.1  # how often the main thread checks timeouts


class Pool:
    """Owns the pool process's connections (its Store and Broker) and its roles; keeps no
    state of its own but the count of suspensions it submitted (`_suspended`, guarded by
    `_count_lock`), which its last log line reports. Tests run a real Pool in a thread and
    reach it through its roles: `stop.signal()`, `liveness.subscribed`, `fetcher.join()`,
    `slots`, `fetcher.claims`, `completer`."""

    def __init__(self, app: App, jt: JobType, worker_id: str, settings: Settings) -> None:
        self.app = app
        self.jt = jt
        self.worker_id = worker_id
        self.settings = settings
        # At-least-once claims and completions may commit asynchronously: one lost in a
        # Postgres crash means a re-run, never a loss (Liveness finds and releases it).
        async_commit = jt.delivery == "at_least_once"
        self.store = Store(
            settings.database_url,
            max_size=3,
            session={"synchronous_commit": "off"} if async_commit else None,
            pooled=settings.pgbouncer,
        )
        self.broker = Broker(settings)
        # No LISTEN session behind a pooler without a listen URL: chain hops are announced
        # over Redis instead (coordinator.listen_url).
        self.wake_over_redis = settings.pgbouncer and not settings.listen_database_url
        self.metrics = Recorder(self.broker)
        self.log = logger.bind(pool=jt.name, worker_id=worker_id)
        self._suspended = 0
        self._count_lock = threading.Lock()
        self.stop = Stop()
        self.slots = Slots(self.stop.draining, jt.concurrency)
        self.memory_cap = MemoryCap(jt.max_rss_mb)  # issue 12: checked in run()'s loop
        self.completer = Completer(
            self.store,
            self.broker,
            self._written,
            max_error_bytes=settings.max_result_bytes,
            on_submit=self._submitted,
        )
        self.fetcher = Fetcher(
            jt,
            worker_id,
            settings,
            self.store,
            self.broker,
            self.metrics,
            self.slots,
            self.stop.acquiring_stopped,
            heartbeat_age_s=lambda: self.liveness.heartbeat_age_s(),
            flow=Flow(self.store, self.broker, jt.name, jt.limits),
            scale=lambda concurrency: self.runners.scale(concurrency),
        )
        self.liveness = Liveness(
            jt.name,
            worker_id,
            settings,
            self.store,
            self.broker,
            self.fetcher.claims,
            self.slots,
            self.stop,
            check_untracked=async_commit,
        )
        self.runners = Runners(
            app,
            jt,
            settings,
            self.store,
            self.broker,
            self.metrics,
            self.slots,
            self.fetcher,
            self.completer,
            self.stop.draining,
        )
        self.watchdog = Watchdog(jt, settings, self.slots, self.completer, self.stop)
        self.shutdown = Shutdown(
            settings, self.stop, self.slots, self.fetcher, self.completer, self.watchdog, self.log
        )

    def run(self) -> int:
        self.store.register_worker(
            self.worker_id, socket.gethostname(), os.getpid(), "pool", self.jt.name
        )
        if threading.current_thread() is threading.main_thread():
            self.stop.install_signal_handlers()
        self.completer.start()
        self.metrics.start()
        self.runners.start()
        self.fetcher.start()
        self.liveness.start()
        self.log.info("pool started", concurrency=self.jt.concurrency)
        while not self.stop.acquiring_stopped.wait(WATCH_EVERY_S):
            self.watchdog.check()
            if self.memory_cap.exceeded():  # issue 12: drain, exit, be forked again
                self.log.warning(
                    "memory cap passed: recycling the pool",
                    rss_mb=round(self.memory_cap.seen_mb),
                    max_rss_mb=self.jt.max_rss_mb,
                )
                self.stop.request(StopReason.MEMORY_CAP)
        report = self.shutdown.run()
        self.metrics.stop()
        self.liveness.stop()
        try:
            self.store.deregister_worker(self.worker_id)
        except psycopg.Error as exc:
            self.log.warning("could not remove worker row", **error_fields(exc))
        self.slots.close(self.runners.count)  # idle runners end
        with self._count_lock:
            suspended = self._suspended
        self.log.info(
            "pool stopped",
            suspended=suspended,
            reason=self.stop.reason.value,
            taken_over=report.taken_over,
            handed_back=report.handed_back,
        )
        self.log.debug(
            "pool counters", completion_batches=self.completer.batches, **self.fetcher.counts
        )
        if not report.written:
            self.log.error("stopped with completions unwritten: the supervisor releases them")
            return ChildExit.UNWRITTEN
        return self.stop.exit_code

    def close(self) -> None:
        """Close the connections (a test's pool thread; a pool process just exits)."""
        self.store.close()
        self.broker.close()

    def _submitted(self, completion: Completion) -> None:
        self.metrics.completion(self.jt.name, completion)
        if completion.outcome == "suspend":
            with self._count_lock:
                self._suspended += 1

    def _written(self, written: list[Completion]) -> None:
        self.fetcher.claims.forget(written)
        if self.wake_over_redis:
            # Chain try ids are "<chain>:<key>:<try>"; a plain id with a colon only costs
            # the coordinator a look at a chain that is not there.
            chains = [c.id.split(":", 1)[0] for c in written if ":" in c.id]
            if chains:
                try:
                    self.broker.publish_wake(chains)
                except redis.RedisError as exc:
                    self.log.debug("chain wake-up not published", error=repr(exc))


def run_pool(app: App, name: str, worker_id: str, settings: Settings) -> int:
    return Pool(app, app.types[name], worker_id, settings).run()
