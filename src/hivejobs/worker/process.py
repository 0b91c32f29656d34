"""Pool process: one or more job types (lanes), each with its own runner threads and fetcher.

The composition root of a pool process. A lane is one job type (`Lane`: slots, fetcher,
runners, completer, watchdog, shutdown): its concurrency, delivery, timeout, limits,
retries, claims and worker row are its own. The process (`Pool`) owns what its lanes share:
the Store and Broker, the metrics recorder, the stop state, the heartbeat and control
channel (Liveness), the memory cap. A type without `pool=` is a Pool of one lane;
types of one `pool=` are one Pool of several (worker/placement.py). It starts the threads, watches
timeouts until a stop is asked for, then drains every lane at once and says how it ended (a
ChildExit). The roles keep every rule; this file only wires them. Never runs a job it has
not claimed in Postgres or a job of another type in a lane, and never writes the end of a
claim without its claim token.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable, Sequence

import psycopg
import redis
from loguru import logger

from hivejobs.broker import Broker
from hivejobs.config import Settings
from hivejobs.flow import Flow
from hivejobs.jobtypes import JobType
from hivejobs.logs import error_fields
from hivejobs.metrics import Recorder
from hivejobs.records.jobs import Completion
from hivejobs.store import PREPARED_PLANS, Store
from hivejobs.worker.async_handlers import is_async
from hivejobs.worker.completer import Completer
from hivejobs.worker.exits import ChildExit
from hivejobs.worker.fetcher import Fetcher
from hivejobs.worker.liveness import Liveness, Tracked
from hivejobs.worker.loopwatch import LoopWatch
from hivejobs.worker.memory import MemoryCap
from hivejobs.worker.placement import store_size
from hivejobs.worker.runner import Runners
from hivejobs.worker.served import ServedApp
from hivejobs.worker.shutdown import Shutdown, ShutdownReport, Stop, StopReason
from hivejobs.worker.slots import Slots
from hivejobs.worker.tasks import Tasks
from hivejobs.worker.watchdog import Watchdog

WATCH_EVERY_S = 0.1  # how often the main thread checks timeouts


class Lane:
    """One job type of a pool process: owns its roles (slots, fetcher, runners, completer,
    watchdog, shutdown) and the count of suspensions it submitted (`suspended`, guarded by
    `_count_lock`). Shares the process's store (for an at-most-once lane beside at-least-once
    ones, its synchronous() view: see Pool), broker, metrics and stop state; asks the
    process's liveness for the heartbeat's age (`heartbeat_age_s`)."""

    def __init__(
        self,
        app: ServedApp,
        jt: JobType,
        worker_id: str,
        settings: Settings,
        store: Store,
        broker: Broker,
        metrics: Recorder,
        stop: Stop,
        heartbeat_age_s: Callable[[], float],
        wake_over_redis: bool,
    ) -> None:
        self.jt = jt
        self.worker_id = worker_id
        self.broker = broker
        self.metrics = metrics
        self.wake_over_redis = wake_over_redis
        self.log = logger.bind(pool=jt.name, worker_id=worker_id)
        self.suspended = 0
        self._count_lock = threading.Lock()
        self.completer = Completer(
            store,
            broker,
            self._written,
            max_error_bytes=settings.max_result_bytes,
            on_submit=self._submitted,
        )
        # An `async def` type's claims run as tasks on the process's loop (Tasks), woken by
        # each hand-over; a `def` type's on runner threads blocked on the work queue.
        runs_tasks = is_async(jt.handler)
        self.fetcher = Fetcher(
            jt,
            worker_id,
            settings,
            store,
            broker,
            metrics,
            stop.draining,
            stop.acquiring_stopped,
            heartbeat_age_s=heartbeat_age_s,
            flow=Flow(store, broker, jt.name, jt.limits, jt.sequence is not None),
            scale=self._scale,
            handed_over=self._wake if runs_tasks else None,
        )
        self.slots = self.fetcher.slots  # made by the fetcher: it wakes on its claim room
        self.runners = Runners(
            app,
            jt,
            settings,
            store,
            broker,
            metrics,
            self.slots,
            self.fetcher,
            self.completer,
            stop.draining,
            threads=not runs_tasks,
        )
        self.tasks = Tasks(self.runners) if runs_tasks else None
        self.watchdog = Watchdog(jt, settings, self.slots, self.completer, stop)
        self.shutdown = Shutdown(
            settings, stop, self.slots, self.fetcher, self.completer, self.watchdog.check, self.log
        )

    def tracked(self) -> Tracked:
        """What liveness watches of this lane: an at-least-once lane's claims and completions
        commit asynchronously (Pool), so only its claims can be lost in a Postgres crash."""
        async_commit = self.jt.delivery == "at_least_once"
        return Tracked(self.worker_id, self.fetcher.claims, self.slots, async_commit)

    def start(self) -> None:
        self.completer.start()
        self.runners.start()
        if self.tasks is not None:
            self.tasks.start()
        self.fetcher.start()

    def _scale(self, concurrency: int) -> bool:
        return (self.tasks or self.runners).scale(concurrency)

    def _wake(self) -> None:
        if self.tasks is not None:
            self.tasks.wake()

    def stopped(self, report: ShutdownReport, reason: StopReason) -> None:
        """After the drain: idle runners end; the lane's last log lines."""
        self.slots.close(self.runners.count)
        with self._count_lock:
            suspended = self.suspended
        self.log.info(
            "pool stopped",
            suspended=suspended,
            reason=reason.value,
            taken_over=report.taken_over,
            handed_back=report.handed_back,
        )
        self.log.debug(
            "pool counters", completion_batches=self.completer.batches, **self.fetcher.counts
        )

    def _submitted(self, completion: Completion) -> None:
        self.metrics.completion(self.jt.name, completion)
        if completion.outcome == "suspend":
            with self._count_lock:
                self.suspended += 1

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
                    self.log.debug("chain wake-up not published", **error_fields(exc))


class Pool:
    """Owns the pool process's connections (its Store and Broker, shared by its lanes), its
    metrics recorder, stop state, liveness and memory cap, and its lanes (`lanes`, one per
    job type, fixed at construction). Keeps no state of its own. Tests run a real Pool in a
    thread and reach it through its roles: `stop.signal()`, `liveness.subscribed`, and for a
    pool of one type `fetcher`, `slots`, `completer` (its lane's)."""

    def __init__(
        self,
        app: ServedApp,
        jt: JobType | Sequence[JobType],
        worker_id: str | Sequence[str],
        settings: Settings,
        name: str | None = None,
    ) -> None:
        """One type and its worker id, or the types of a shared pool `name` and one worker
        id each (a worker row per type: rescue, `hivejobs workers` and the claims stay per
        type)."""
        types = [jt] if isinstance(jt, JobType) else list(jt)
        worker_ids = [worker_id] if isinstance(worker_id, str) else list(worker_id)
        if not types or len(types) != len(worker_ids):
            raise ValueError("a pool needs one worker id per job type")
        self.app = app
        self.name = name or types[0].name
        self.settings = settings
        # At-least-once claims and completions may commit asynchronously: one lost in a
        # Postgres crash means a re-run, never a loss (Liveness finds and releases it).
        # At-most-once ones never: a lost claim would let its job start again, and a lost
        # completion would leave the row running, untracked (released, it would run again).
        # The lanes share one store; in a pool of both, its session commits asynchronously
        # and the at-most-once lanes use its synchronous() view: only they pay the WAL flush.
        # A synchronous commit also flushes every earlier asynchronous one.
        async_commit = any(t.delivery == "at_least_once" for t in types)
        mixed = async_commit and any(t.delivery == "at_most_once" for t in types)
        session = {"synchronous_commit": "off"} if async_commit else {}
        if not settings.pgbouncer:
            # Prepared statements keep one generic plan: under the default
            # plan_cache_mode the archive statement was planned afresh at every call
            # (~0.3 ms of backend CPU each), its custom plans always looking cheaper than
            # the generic one. Every pool statement's generic plan finds its rows by key
            # whatever the statistics and the table's size when it was made (PREPARED_PLANS,
            # tests/integration/test_plan_stability.py). Behind a transaction pooler nothing
            # is prepared: there it would change nothing.
            session.update(PREPARED_PLANS, plan_cache_mode="force_generic_plan")
        self.store = Store(
            settings.database_url,
            max_size=store_size(len(types)),
            session=session or None,
            pooled=settings.pgbouncer,
            synchronous_view=mixed,
            role=f"hivejobs pool {self.name}",
        )
        synchronous = self.store.synchronous() if mixed else self.store
        self.broker = Broker(settings)
        # No LISTEN session behind a pooler without a listen URL: chain hops are announced
        # over Redis instead (coordinator.listen_url).
        wake_over_redis = settings.pgbouncer and not settings.listen_database_url
        self.metrics = Recorder(self.broker)
        self.log = logger.bind(pool=self.name, worker_id=worker_ids[0])
        self.stop = Stop()
        # The same for every type of the pool (placement.py).
        self.memory_cap = MemoryCap(types[0].max_rss_mb)
        self.lanes = [
            Lane(
                app,
                t,
                w,
                settings,
                self.store if t.delivery == "at_least_once" else synchronous,
                self.broker,
                self.metrics,
                self.stop,
                lambda: self.liveness.heartbeat_age_s(),
                wake_over_redis,
            )
            for t, w in zip(types, worker_ids, strict=True)
        ]
        self.liveness = Liveness(
            {self.name, *(t.name for t in types)},
            [lane.tracked() for lane in self.lanes],
            settings,
            self.store,
            self.broker,
            self.stop,
        )
        self.loop_watch = self._loop_watch()

    def _loop_watch(self) -> LoopWatch | None:
        """The watch on the event loop of the `async def` lanes (one loop per process)."""
        async_lanes = [(lane.jt, lane.tasks) for lane in self.lanes if lane.tasks is not None]
        if not async_lanes:
            return None
        tasks = [t for _, t in async_lanes]
        return LoopWatch(
            tasks[0].loop,
            tasks[0].loop_thread,
            {jt.name: jt.handler for jt, _ in async_lanes},
            busy=lambda: any(t.busy for t in tasks),
            threshold_s=self.settings.loop_blocked_after_s,
        )

    # A pool of one type: its lane's roles, as tests and tools reach them.
    @property
    def jt(self) -> JobType:
        return self.lanes[0].jt

    @property
    def worker_id(self) -> str:
        return self.lanes[0].worker_id

    @property
    def slots(self) -> Slots:
        return self.lanes[0].slots

    @property
    def fetcher(self) -> Fetcher:
        return self.lanes[0].fetcher

    @property
    def completer(self) -> Completer:
        return self.lanes[0].completer

    @property
    def runners(self) -> Runners:
        return self.lanes[0].runners

    def run(self) -> int:
        for lane in self.lanes:
            self.store.register_worker(
                lane.worker_id, socket.gethostname(), os.getpid(), "pool", lane.jt.name
            )
        if threading.current_thread() is threading.main_thread():
            self.stop.install_signal_handlers()
        self.metrics.start()
        for lane in self.lanes:
            lane.start()
        self.liveness.start()
        if self.loop_watch is not None:
            self.loop_watch.start()
        self.log.info(
            "pool started",
            concurrency=self.jt.concurrency
            if len(self.lanes) == 1
            else {lane.jt.name: lane.jt.concurrency for lane in self.lanes},
            postgres_connections=store_size(len(self.lanes)),
        )
        while not self.stop.acquiring_stopped.wait(WATCH_EVERY_S):
            for lane in self.lanes:
                lane.watchdog.check()
            if self.memory_cap.exceeded():  # drain, exit, be forked again
                self.log.warning(
                    "memory cap passed: recycling the pool",
                    rss_mb=round(self.memory_cap.seen_mb),
                    max_rss_mb=self.memory_cap.max_rss_mb,
                )
                self.stop.request(StopReason.MEMORY_CAP)
        reports = self._drain()
        if self.loop_watch is not None:
            self.loop_watch.stop()
        self.metrics.stop()
        self.liveness.stop()
        for lane in self.lanes:
            try:
                self.store.deregister_worker(lane.worker_id)
            except psycopg.Error as exc:
                self.log.warning("could not remove worker row", **error_fields(exc))
        for lane, report in zip(self.lanes, reports, strict=True):
            lane.stopped(report, self.stop.reason)
        if not all(report.written for report in reports):
            self.log.error("stopped with completions unwritten: the supervisor releases them")
            return ChildExit.UNWRITTEN
        return self.stop.exit_code

    def _drain(self) -> list[ShutdownReport]:
        """Every lane's shutdown at once, each by the same deadline (shutdown_timeout_s from
        now): one after the other, the last would start past it. An error in one is raised
        once all have ended (a crash: the supervisor releases what is left)."""
        if len(self.lanes) == 1:
            return [self.lanes[0].shutdown.run()]
        reports: dict[int, ShutdownReport] = {}
        errors: list[BaseException] = []

        def drain(i: int, lane: Lane) -> None:
            try:
                reports[i] = lane.shutdown.run()
            except BaseException as exc:  # re-raised below, in the main thread
                errors.append(exc)

        threads = [
            threading.Thread(target=drain, args=(i, lane), name=f"drain-{lane.jt.name}")
            for i, lane in enumerate(self.lanes)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return [reports[i] for i in range(len(self.lanes))]

    def close(self) -> None:
        """Close the connections (a test's pool thread; a pool process just exits)."""
        self.store.close()
        self.broker.close()


def run_pool(
    app: ServedApp, name: str, types: Sequence[str], worker_ids: Sequence[str], settings: Settings
) -> int:
    """The main function of a pool process: pool `name` running `types`."""
    return Pool(app, [app.types[t] for t in types], worker_ids, settings, name).run()
