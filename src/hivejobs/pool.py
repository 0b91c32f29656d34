"""Pool process: one job type, `concurrency` runner threads fed by one fetcher.

The fetcher pops as many ids as there are free slots (one BLMPOP), claims them in one UPDATE
by primary key, and hands the claimed jobs to runner threads; finished attempts go to the
Completer. While the Completer lags, the fetcher stops claiming (claim_room: backpressure).
One heartbeat per process. Never runs a job it has not claimed in Postgres or a job of
another type, and never writes the end of a claim without its claim token.
"""

from __future__ import annotations

import os
import queue
import signal
import socket
import threading
import time
from dataclasses import dataclass, field

import psycopg
import redis
from loguru import logger

from hivejobs.app import App, JobType
from hivejobs.broker import Broker, ControlMessage, Popped
from hivejobs.capture import Captured, capturing
from hivejobs.completer import Completer
from hivejobs.config import Settings
from hivejobs.context import JobContext
from hivejobs.executor import ended, execute, failed
from hivejobs.failpoints import failpoint
from hivejobs.flow import Flow
from hivejobs.logs import error_fields, fatal_on_error
from hivejobs.memory import MemoryCap
from hivejobs.metrics import Recorder
from hivejobs.records import ClaimedJob, Completion, Outcome
from hivejobs.store import Store
from hivejobs.store.chains import ChainStore, looks_like_try_id

EXIT_RECYCLE = 0  # a clean exit the supervisor answers with an immediate restart
EXIT_RELOAD = 75  # `hivejobs restart`: the supervisor re-execs itself to load new code
PREFETCH = 64
PREFETCH_BELOW_S = 0.005
MSG_FOREIGN_ID = (
    "foreign job id dropped: a job of another type was in this pool's list (logged once per"
    " list; counted in foreign_ids)"
)
# Backpressure (issue 21): finished attempts whose completion is not yet written, per runner
# thread, that a pool may hold beside a full set of claims in hand. A runner slot frees when
# a job finishes running, not when its completion is written, so without this bound a lagging
# completer let claims run far ahead: rows stood `running` by the ten thousand, and finished
# work that lives only in this process's memory is lost work if it dies.
UNWRITTEN_PER_RUNNER = 2


@dataclass
class Running:
    job: ClaimedJob
    ctx: JobContext
    started: float = field(default_factory=time.monotonic)
    abandoned: bool = False  # ended by the watchdog or shutdown; the runner's result is dropped


class Pool:
    def __init__(self, app: App, jt: JobType, worker_id: str, settings: Settings) -> None:
        self.app = app
        self.jt = jt
        self.worker_id = worker_id
        self.settings = settings
        # At-least-once claims and completions may commit asynchronously: one lost in a
        # Postgres crash means a re-run, never a loss (the claim check below finds it).
        self.async_commit = jt.delivery == "at_least_once"
        self.store = Store(
            settings.database_url,
            max_size=3,
            session={"synchronous_commit": "off"} if self.async_commit else None,
            pooled=settings.pgbouncer,
        )
        self.broker = Broker(settings)
        # No LISTEN session behind a pooler without a listen URL: chain hops are announced
        # over Redis instead (coordinator.listen_url).
        self.wake_over_redis = settings.pgbouncer and not settings.listen_database_url
        self.metrics = Recorder(self.broker)
        self.completer = Completer(
            self.store,
            self.broker,
            self._forget,
            max_error_bytes=settings.max_result_bytes,
            on_submit=lambda c: self.metrics.completion(jt.name, c),
        )
        # Claims not yet finished in Postgres (waiting, running, or finished and not yet
        # written): id -> token. The fetcher keeps it within claim_room() (backpressure).
        self.held: dict[str, int] = {}
        self.claim_lock = threading.Lock()
        self.work: queue.SimpleQueue[ClaimedJob | None] = queue.SimpleQueue()
        self.running: dict[str, Running] = {}
        self.lock = threading.Condition()
        self.reserved = 0  # claimed jobs not yet finished (waiting or running)
        # Runner threads wanted (`hivejobs scale` changes it; guarded by `lock`) and started
        # (only the fetcher and run() start them).
        self.concurrency = jt.concurrency
        self.runners = 0
        self.stop_acquiring = threading.Event()
        self.shutting_down = threading.Event()
        # SIGUSR1 from the supervisor (a second Ctrl-C or SIGTERM there): suspend running
        # jobs now instead of waiting for them. Never raised by a repeated SIGTERM here (R10).
        self.stop_now = threading.Event()
        self.suspended = 0  # claims handed back by shutdown (for the stop line)
        self.recycle_reason: str | None = None
        # A job whose process died before runs alone, so a poison pill cannot take innocent
        # neighbours down with it again (their deaths would count against them).
        self.isolation = threading.Lock()
        self.isolating = False
        # Claims beyond `concurrency` cut statements per job for short jobs; never for
        # at-most-once (a claim dying with us fails it) and not for slow jobs, whose
        # prefetched claims would wait long and be charged a worker loss if we die.
        # Nor for a type with fleet-wide limits: a claim waiting here holds a slot (issue 12).
        self.prefetch = PREFETCH if jt.delivery == "at_least_once" and jt.limits is None else 0
        self.flow = Flow(self.store, self.broker, jt.name, jt.limits)  # issue 12 hook
        self.memory_cap = MemoryCap(jt.max_rss_mb)  # issue 12 hook
        self.avg_run_s = 1.0  # pessimistic until measured
        self.last_heartbeat_ok = time.monotonic()
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

    # -- lifecycle ---------------------------------------------------------------------

    def run(self) -> int:
        self.store.register_worker(
            self.worker_id, socket.gethostname(), os.getpid(), "pool", self.jt.name
        )
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, self._on_stop_signal)
            signal.signal(signal.SIGUSR1, self._on_stop_now_signal)
        self.completer.start()
        self.metrics.start()
        threads = [self._new_runner() for _ in range(self.jt.concurrency)]
        self._fetcher_thread = threading.Thread(
            target=fatal_on_error(self._fetcher), name="fetcher", daemon=True
        )
        threads += [
            self._fetcher_thread,
            threading.Thread(target=fatal_on_error(self._heartbeat), name="heartbeat", daemon=True),
            threading.Thread(target=fatal_on_error(self._control), name="control", daemon=True),
        ]
        for t in threads:
            t.start()
        self.log.info("pool started", concurrency=self.jt.concurrency)
        while not self.stop_acquiring.wait(0.1):
            self._watch_timeouts()
            if self.memory_cap.exceeded():  # issue 12 hook: drain, exit, be forked again
                self.log.warning(
                    "memory cap passed: recycling the pool",
                    rss_mb=round(self.memory_cap.seen_mb),
                    max_rss_mb=self.jt.max_rss_mb,
                )
                self.recycle_reason = "memory cap"
                self.stop_acquiring.set()
        return self._shutdown()

    def _on_stop_signal(self, signum: int, _frame: object) -> None:
        # Heroku sends SIGTERM to every process, maybe several times: never escalate (R10).
        # No logging here: loguru's lock may be held by the interrupted frame.
        self.stop_acquiring.set()

    def _on_stop_now_signal(self, signum: int, _frame: object) -> None:
        # No lock, no logging here (the interrupted frame may hold them): _wait_idle polls.
        self.stop_now.set()
        self.stop_acquiring.set()

    def _shutdown(self) -> int:
        """Let running jobs finish, then suspend what still runs; exit before SIGKILL."""
        deadline = time.monotonic() + self.settings.shutdown_timeout_s
        self.shutting_down.set()
        # A pop in flight may still claim: let it finish, so no claim outlives this process.
        self._fetcher_thread.join(self.settings.pop_block_s + 2.0)
        with self.lock:
            busy = len(self.running)
        self.log.info(
            "stopping: finishing running jobs", running=busy, reason=self.recycle_reason or "signal"
        )
        soft = deadline - min(self.settings.stop_grace_s, self.settings.shutdown_timeout_s / 2)
        self._wait_idle(soft, watch=True)
        with self.lock:
            for r in self.running.values():
                r.ctx.request_stop()
        self._wait_idle(deadline, watch=False)
        with self.lock:
            stragglers = [r for r in self.running.values() if not r.abandoned]
            for r in stragglers:
                r.abandoned = True
        for r in stragglers:
            self._suspend(r.job, started=True)
        self._drain_unstarted()
        failpoint("pool.after_suspend_write_before_exit")
        self.completer.flush(5.0)
        self.metrics.stop()
        try:
            self.store.deregister_worker(self.worker_id)
        except psycopg.Error as exc:
            self.log.warning("could not remove worker row", **error_fields(exc))
        self.log.info("pool stopped", suspended=self.suspended, reason=self.recycle_reason)
        self.log.debug("pool counters", completion_batches=self.completer.batches, **self.counts)
        return EXIT_RELOAD if self.recycle_reason == "restart requested" else EXIT_RECYCLE

    def _wait_idle(self, until: float, watch: bool) -> None:
        while time.monotonic() < until and not self.stop_now.is_set():
            self._drain_unstarted()
            with self.lock:
                if not any(not r.abandoned for r in self.running.values()):
                    return
                self.lock.wait(0.1)
            if watch:
                self._watch_timeouts()

    def _drain_unstarted(self) -> None:
        """Claimed jobs that never started go back to the queue, attempt uncounted."""
        while True:
            try:
                job = self.work.get_nowait()
            except queue.Empty:
                return
            if job is not None:
                self._suspend(job, started=False)
                self._release_slot()

    def _suspend(self, job: ClaimedJob, started: bool) -> None:
        if started and job.delivery == "at_most_once":
            # At-most-once and maybe started: fail it, never requeue.
            self.completer.submit(self._ended(job, "failed", "interrupted by shutdown"))
        else:
            self.suspended += 1
            self.completer.submit(
                Completion(id=job.id, claim_token=job.claim_token, outcome="suspend")
            )

    # -- fetcher -----------------------------------------------------------------------

    def claim_room(self) -> int:
        """How many ids the fetcher may claim now; called with `self.lock` held.

        Two bounds. Slots: claims in hand (waiting or running) stay within concurrency, plus
        the prefetch for short at-least-once jobs. Backpressure: every claim not yet written
        in Postgres (`held`: in hand or finished and unwritten) stays within
        (UNWRITTEN_PER_RUNNER x concurrency) + prefetch. Every claim in hand may end up
        unwritten, so finished-but-unwritten completions never exceed that number, nor do
        this pool's `running` rows; when the completer lags, claiming stops until it writes
        (its callback, _forget, wakes the fetcher). With the slots full, the second bound
        only cuts a claim while more than `concurrency` completions wait to be written: a
        healthy completer writes a few at a time.
        """
        extra = self.prefetch if self.avg_run_s < PREFETCH_BELOW_S else 0
        slots = self.concurrency + extra - self.reserved
        unwritten_room = UNWRITTEN_PER_RUNNER * self.concurrency + extra - len(self.held)
        if unwritten_room < slots and slots > 0:
            self.counts["paused_for_completions"] += int(unwritten_room <= 0)
        return min(slots, unwritten_room)

    def _fetcher(self) -> None:
        backoff = 0.05
        while not self.stop_acquiring.is_set():
            with self.lock:
                free = self.claim_room()
                if free <= 0 or self.isolating:
                    self.lock.wait(0.5)
                    continue
            if time.monotonic() - self.last_heartbeat_ok > self.settings.stuck_after_s / 2:
                # We cannot prove we are alive: claims made now could be rescued under us.
                self.stop_acquiring.wait(0.2)
                continue
            try:
                # Flow control (issue 12 hook): a paused or fleet-limited type waits here,
                # its ids left in Redis; own completions (notify) end a wait for a slot early.
                room = self.flow.room(free)
                if self._scale(self.flow.concurrency or self.jt.concurrency):
                    continue  # `free` was counted for the old concurrency
                if room.allowed <= 0:
                    with self.lock:
                        self.lock.wait(room.wait_s)
                    continue
                popped = self.broker.pop(self.jt.name, room.allowed)
                self.counts["pops"] += 1
                if popped.ids:
                    self._claim(popped)
                backoff = 0.05
            except (redis.RedisError, psycopg.Error) as exc:
                self.log.warning(
                    "fetch failed, retrying",
                    keys=self.broker.queue_keys_glob(self.jt.name),
                    retry_in_s=backoff,
                    **error_fields(exc),
                )
                self.stop_acquiring.wait(backoff)
                backoff = min(backoff * 2, 2.0)

    def _claim(self, popped: Popped) -> None:
        ids = popped.ids
        with self.claim_lock:
            try:
                with self.store.connection() as conn:
                    jobs = self.flow.claim(conn, ids, self.worker_id)  # issue 12 hook
            except psycopg.Error as exc:
                failure: psycopg.Error | None = exc
            else:
                failure = None
                with self.lock:
                    self.held.update((j.id, j.claim_token) for j in jobs)
                self.counts["claim_statements"] += 1
                self.counts["claimed"] += len(jobs)
        if failure is not None:
            # Outside the claim lock: the heartbeat's claim check must not wait on an outage.
            # A popped duplicate of a job we already run is ours for good: never release it.
            with self.lock:
                unheld = [i for i in ids if i not in self.held]
            self._release_ambiguous(unheld)
            raise failure
        failpoint("pool.after_claim_commit")
        self.metrics.picked_up(jobs)
        with self.lock:
            self.reserved += len(jobs)
        for job in jobs:
            self.work.put(job)
        if len(jobs) < len(ids):
            self.flow.put_back(popped, jobs)  # issue 12 hook: refused by a pause or limit
            claimed = {j.id for j in jobs}
            self._drop_foreign(popped.key, [i for i in ids if i not in claimed])

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
                self.broker.push_many([(r[0], r[1], r[2]) for r in rows])
                return
            except (psycopg.Error, redis.RedisError):
                if self.stop_acquiring.wait(0.5):
                    return

    def _forget(self, written: list[Completion]) -> None:
        with self.lock:
            for c in written:
                if self.held.get(c.id) == c.claim_token:
                    del self.held[c.id]
            self.lock.notify_all()
        if self.wake_over_redis:
            # Chain try ids are "<chain>:<key>:<try>"; a plain id with a colon only costs
            # the coordinator a look at a chain that is not there.
            chains = [c.id.split(":", 1)[0] for c in written if ":" in c.id]
            if chains:
                try:
                    self.broker.publish_wake(chains)
                except redis.RedisError as exc:
                    self.log.debug("chain wake-up not published", error=repr(exc))

    def _release_untracked_claims(self) -> None:
        """After a Postgres crash an asynchronously committed completion may be gone, leaving
        a `running` row that this live process no longer tracks: put it back in the queue."""
        with self.claim_lock:
            rows = self.store.running_claims(self.worker_id)
            with self.lock:
                lost = [(i, t) for i, t in rows if self.held.get(i) != t]
        if lost:
            # Most are completions that committed between the read and the check above
            # (already archived, so nothing to release): only real releases are news.
            released = self.store.release_claims(lost)
            if released:
                self.broker.push_many([(r[0], r[1], r[2]) for r in released])
                self.log.warning(
                    "released claims this process no longer tracks", jobs=len(released)
                )

    # -- runners -----------------------------------------------------------------------

    def _new_runner(self) -> threading.Thread:
        self.runners += 1
        name = f"runner-{self.runners - 1}"
        return threading.Thread(target=fatal_on_error(self._runner), name=name, daemon=True)

    def _scale(self, concurrency: int) -> bool:
        """`hivejobs scale` (issue 12 hook): claim_room follows `concurrency` at once; more
        runner threads start when it grows. When it shrinks the extra runners stay, idle:
        fewer claims are made, and no running job is interrupted."""
        if concurrency == self.concurrency:
            return False
        with self.lock:
            before, self.concurrency = self.concurrency, concurrency
            self.lock.notify_all()
        while self.runners < concurrency:
            self._new_runner().start()
        self.log.info("concurrency scaled", concurrency=concurrency, before=before)
        return True

    def _runner(self) -> None:
        while True:
            job = self.work.get()
            if job is None:
                return
            if self.shutting_down.is_set():
                self._suspend(job, started=False)
                self._release_slot()
                continue
            self._run_one(job)

    def _run_one(self, job: ClaimedJob) -> None:
        suspect = job.lost > 0
        if suspect and not self.isolation.acquire(blocking=False):
            self._suspend(job, started=False)  # another suspect runs: give way, uncounted
            self._release_slot()
            return
        try:
            if self._wait_turn(job.id if suspect else None):
                self._run_started(job)
            else:
                self._suspend(job, started=False)
                self._release_slot()
        finally:
            if suspect:
                with self.lock:
                    self.isolating = False
                    self.lock.notify_all()
                self.isolation.release()

    def _wait_turn(self, suspect_id: str | None) -> bool:
        """A suspect waits until this process holds no other claim in Postgres: neighbours
        give way (back to the queue, uncounted) and their release must be committed, so that
        a death now is charged to the suspect alone. False means: do not start this job."""
        with self.lock:
            if suspect_id is None:
                return not self.isolating and not self.shutting_down.is_set()
            self.isolating = True
            while not self.shutting_down.is_set():
                others = [
                    i
                    for i in self.held
                    if i != suspect_id and not (i in self.running and self.running[i].abandoned)
                ]
                if not others:
                    return True
                self.lock.wait(0.1)
            return False

    def _run_started(self, job: ClaimedJob) -> None:
        ctx = JobContext(job, self.app, self.broker)
        entry = Running(job, ctx)
        with self.lock:
            self.running[job.id] = entry
        began = time.monotonic()
        if looks_like_try_id(job.id):  # a chain try: its output goes to the job log
            with capturing(self.settings.job_log_output_bytes) as output:
                completion = self._execute(job, ctx)
            self._keep_output(job, output)
        else:
            completion = self._execute(job, ctx)
        self.metrics.observe("run", job.name, time.monotonic() - began)
        with self.lock:
            self.running.pop(job.id, None)
            abandoned = entry.abandoned
        if not abandoned:
            failpoint("pool.before_completion_commit")
            if completion.outcome == "suspend":
                self.suspended += 1  # the handler stopped when told to
            self.completer.submit(completion)
        self._release_slot()

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

    def _release_slot(self) -> None:
        with self.lock:
            self.reserved -= 1
            self.lock.notify_all()

    def _execute(self, job: ClaimedJob, ctx: JobContext) -> Completion:
        started = time.monotonic()
        completion = execute(
            self.jt,
            job,
            ctx,
            max_result_bytes=self.settings.max_result_bytes,
            shutting_down=self.shutting_down.is_set,
        )
        if completion.outcome == "succeeded":
            self.avg_run_s += (time.monotonic() - started - self.avg_run_s) * 0.1
        return completion

    def _failed(self, job: ClaimedJob, ctx: JobContext, error: str, delay: float) -> Completion:
        return failed(job, ctx, error, delay, self.settings.max_result_bytes)

    def _ended(self, job: ClaimedJob, outcome: Outcome, error: str) -> Completion:
        return ended(job, outcome, error, self.settings.max_result_bytes)

    # -- timeouts ----------------------------------------------------------------------

    def _watch_timeouts(self) -> None:
        """rickover's rule: past timeout, ask the job to stop; past timeout + grace, fail the
        attempt and recycle the process (a Python thread cannot be killed)."""
        timeout = self.jt.timeout_s
        if timeout is None:
            return
        now = time.monotonic()
        expired: list[Running] = []
        with self.lock:
            for r in self.running.values():
                age = now - r.started
                if age > timeout and not r.ctx.stop_requested:
                    r.ctx.request_stop()
                if age > timeout + self.settings.timeout_grace_s and not r.abandoned:
                    r.abandoned = True
                    expired.append(r)
        for r in expired:
            r.ctx.logger.error("attempt timed out; recycling the pool", timeout_s=timeout)
            completion = self._failed(
                r.job,
                r.ctx,
                f"timed out after {timeout:g}s",
                self.jt.backoff.delay_s(r.job.attempt),
            )
            self.completer.submit(completion)
        if expired and not self.stop_acquiring.is_set():
            self.recycle_reason = "timed out job"
            self.stop_acquiring.set()

    # -- heartbeat and control ----------------------------------------------------------

    def _heartbeat(self) -> None:
        while True:
            try:
                if self.shutting_down.is_set() and self.completer.idle():
                    return  # our row is about to go: a missing row now is not a death
                if not self.store.heartbeat(self.worker_id):
                    # The coordinator rescued our claims: anything we finish now is fenced.
                    self.log.error("worker row gone (declared dead): exiting")
                    os._exit(3)
                self.last_heartbeat_ok = time.monotonic()
                if self.async_commit:
                    self._release_untracked_claims()
            except (psycopg.Error, redis.RedisError) as exc:
                self.log.warning("heartbeat failed", **error_fields(exc))
            time.sleep(self.settings.heartbeat_s)

    def _control(self) -> None:
        while True:
            try:
                pubsub = self.broker.redis.pubsub(  # type: ignore[no-untyped-call]
                    ignore_subscribe_messages=True
                )
                pubsub.subscribe(self.broker.control_channel)
                while True:
                    msg = pubsub.get_message(timeout=1.0)
                    if msg is not None:
                        self._on_control(msg["data"])
            except redis.RedisError as exc:
                self.log.debug("control channel lost, resubscribing", **error_fields(exc))
                time.sleep(0.5)

    def _on_control(self, raw: bytes) -> None:
        msg = self.broker.decode_control(raw)
        if msg is None:
            return
        if msg.action == "cancel" and msg.job_id:
            with self.lock:
                r = self.running.get(msg.job_id)
                if r is not None:
                    r.ctx.cancelled = True
                    r.ctx.request_stop()
        elif msg.action == "restart" and restart_applies(msg, self.jt.name):
            # A restart of one pool recycles just this process (forked again by the same
            # supervisor); a restart of everything or of this instance reloads the instance.
            self.recycle_reason = "pool restart requested" if msg.pool else "restart requested"
            self.stop_acquiring.set()


def restart_applies(msg: ControlMessage, pool: str) -> bool:
    """Whether a restart message names this pool (or every pool) on this instance (or all)."""
    if msg.pool is not None and msg.pool != pool:
        return False
    return msg.instance is None or msg.instance in instance_names()


def instance_names() -> tuple[str, str]:
    """How `hivejobs restart --instance` may name this instance: its host, or host:pid of
    its supervisor (this pool's parent; `hivejobs run` logs it as it starts)."""
    host = socket.gethostname()
    return host, f"{host}:{os.getppid()}"


def run_pool(app: App, name: str, worker_id: str, settings: Settings) -> int:
    pool = Pool(app, app.types[name], worker_id, settings)
    return pool.run()
