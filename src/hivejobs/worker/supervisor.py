"""`hivejobs run MODULE:APP`: fork one process per pool (and one coordinator), restart crashed
children with backoff, and shut down on SIGTERM without losing work.

A pool is one job type, or the types sharing a `pool=` name (placement.py), each of which has a
worker row of its own in the pool's process.

Holds no Postgres or Redis connection while it forks (children open their own). When a child
dies abnormally its claims are released at once (R8): at-least-once jobs requeued with the
attempt counted, at-most-once jobs failed "worker lost". Each pool leads its own process
group, which is ended when the pool exits: nothing a handler started (holding the pool's
inherited Postgres and Redis sockets) outlives its pool.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import sys
import time

from loguru import logger
from setproctitle import setproctitle

from hivejobs import tracing
from hivejobs.broker import Broker
from hivejobs.config import Settings
from hivejobs.embedded.process import parent_death_preexec
from hivejobs.logs import emit_banner, error_fields, setup_logging
from hivejobs.payload_schema import declare_schemas
from hivejobs.store import new_worker_id
from hivejobs.store.archive import set_type_retentions
from hivejobs.store.schedules import ScheduleStore
from hivejobs.worker.banner import banner
from hivejobs.worker.children import (
    HEALTHY_AFTER_S,
    RESTART_BACKOFF_MAX_S,
    Child,
    end_group,
    kill,
    own_group,
    release_claims,
    run_metrics_child,
    short_store,
)
from hivejobs.worker.exits import ChildExit
from hivejobs.worker.placement import footprint, pool_groups
from hivejobs.worker.served import ServedApp

WAITING_EVERY_S = 5.0  # how often a stopping supervisor says what it still waits for


class Supervisor:
    """Owns the children of `hivejobs run` (one per pool process, the coordinator, and the
    optional metrics and watcher children) and the instance's signals. Single-threaded: its
    signal handlers only set `stopping`, `stop_now` and `reload` and wake the main loop
    through a self-pipe, which reaps, restarts and shuts down. Keeps R8 (docs/concepts/
    reliability.md): a child seen dead has its claims released at once, not after
    `stuck_after`."""

    def __init__(
        self,
        app: ServedApp,
        app_spec: str,
        settings: Settings,
        coordinator: bool = True,
        metrics: tuple[str, int] | None = None,
        watch: list[str] | None = None,
    ) -> None:
        self.app = app
        self.app_spec = app_spec
        self.settings = settings
        self.children: list[Child] = []
        self.groups = pool_groups(app.types.values())
        for g in self.groups:
            self.children += [Child("pool", g.name, i, g.types) for i in range(g.processes)]
        if coordinator:
            self.children.append(Child("coordinator", None, 0))
        self.metrics = metrics  # (host, port) of the /metrics child, if asked for
        if metrics is not None:
            self.children.append(Child("metrics", None, 0))
        self.coordinator = coordinator
        self.watch = watch or []
        if self.watch:
            self.children.append(Child("watcher", None, 0))
        self.stopping = False
        self.stop_now = False  # a second Ctrl-C (or SIGTERM off Heroku): suspend jobs now
        self.reload = False
        self._wake_r, self._wake_w = os.pipe()

    def run(self) -> int:
        setup_logging("supervisor")
        setproctitle(f"hivejobs supervisor {self.app_spec}")
        self.app.connections.resolve()  # before forking: children inherit the chosen URLs
        store = short_store(self.settings)
        try:
            store.check_schema()
            store.upsert_job_types([jt.info() for jt in self.app.types.values()])
            declare_schemas(store, self.app.types)
            ScheduleStore(store).declare(list(self.app.types), list(self.app.schedules.values()))
            set_type_retentions(store, {jt.name: jt.retention_s for jt in self.app.types.values()})
        finally:
            store.close()
        # Redis too, as Postgres above: a wrong password or a stopped Redis is one clear
        # error now (exit 1, the URL redacted), not a warning per pool and per second.
        broker = Broker(self.settings)
        try:
            broker.ping()
        finally:
            broker.close()
        emit_banner(
            *banner(
                self.app.types.values(), self.app_spec, self.settings, self.coordinator, self.watch
            )
        )
        size = footprint(self.groups, self.coordinator)
        if not self.app.types:
            logger.warning("no job types registered in the app: only the coordinator runs")
        os.set_blocking(self._wake_w, False)
        signal.set_wakeup_fd(self._wake_w)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(sig, self._on_signal)
        logger.info(
            "supervisor started",
            app=self.app_spec,
            instance=f"{socket.gethostname()}:{os.getpid()}",
            pools={g.name: g.processes for g in self.groups},
            processes=size.processes,
            postgres_connections_max=size.postgres_connections_max,
            postgres_connections=size.formula,
        )
        for child in self.children:
            self._spawn(child)
        while not self.stopping:
            self._reap()
            self._restart_due()
            if self.reload:
                break
            self._sleep(self._next_wakeup())
        code = self._shutdown()
        if self.reload and not self.stopping:
            # New code and new job types need a fresh interpreter: re-exec ourselves.
            logger.info("reloading: re-executing the supervisor")
            os.execv(sys.executable, [sys.executable, "-m", "hivejobs", *sys.argv[1:]])
        return code

    # -- signals -------------------------------------------------------------------------

    def _on_signal(self, signum: int, _frame: object) -> None:
        if signum in (signal.SIGTERM, signal.SIGINT):
            # A second Ctrl-C means "now". So does a second SIGTERM, except on Heroku, which
            # sends TERM to every process, sometimes more than once: there it changes
            # nothing (R10). "Now" still suspends, never fails, an at-least-once job.
            if self.stopping and (signum == signal.SIGINT or "DYNO" not in os.environ):
                self.stop_now = True
            self.stopping = True
        elif signum == signal.SIGHUP:
            self.reload = True

    def _sleep(self, timeout: float) -> None:
        try:
            ready, _, _ = select.select([self._wake_r], [], [], max(0.0, timeout))
            if ready:
                os.read(self._wake_r, 4096)
        except InterruptedError:
            pass

    def _next_wakeup(self) -> float:
        due = [c.restart_at for c in self.children if c.restart_at is not None]
        return min([1.0] + [d - time.monotonic() for d in due])

    # -- children ----------------------------------------------------------------------

    def _spawn(self, child: Child) -> None:
        child.worker_ids = tuple(new_worker_id() for _ in child.types or ("",))
        child.started = time.monotonic()
        child.restart_at = None
        # A killed supervisor must not leave pools heartbeating with nobody to restart them.
        die_with_parent = parent_death_preexec()  # prepared here, run first in the child
        pid = os.fork()
        if pid == 0:  # child
            code: int = ChildExit.CRASHED
            try:
                if child.role == "pool":
                    own_group(0)
                if die_with_parent is not None:
                    die_with_parent()
                code = self._child_main(child)
            except BaseException as exc:  # a child must never return into the loop
                logger.opt(exception=exc).error("child crashed", role=child.role)
            finally:
                tracing.flush()  # os._exit skips the SDK's atexit shutdown
                os._exit(code)
        if child.role == "pool":
            own_group(pid)  # in both processes: whichever runs first, the group exists
        child.pid = pid
        logger.info(
            "started child", role=child.role, pool=child.pool, pid=pid, worker_id=child.worker_id
        )

    def _child_main(self, child: Child) -> int:
        signal.set_wakeup_fd(-1)
        os.close(self._wake_r)
        os.close(self._wake_w)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        setproctitle(f"hivejobs {child.title} {self.app_spec}")
        setup_logging(child.title)
        if child.role in ("pool", "coordinator"):
            for hook in self.app.process_start_hooks:  # App.on_process_start
                hook()
        if child.role == "watcher":
            from hivejobs.worker.reload import watch_for_changes

            return watch_for_changes(self.watch)
        if child.role == "coordinator":
            from hivejobs.coordinator import run_coordinator

            return run_coordinator(self.settings, child.worker_id)
        if child.role == "metrics":
            assert self.metrics is not None
            return run_metrics_child(self.settings, *self.metrics)
        from hivejobs.worker.process import run_pool

        assert child.pool is not None
        return run_pool(self.app, child.pool, child.types, child.worker_ids, self.settings)

    def _reap(self) -> None:
        while True:
            try:
                # Look before reaping: an unreaped pool still holds its pid, so its process
                # group id cannot have been reused when we end the group below.
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if info is None or info.si_pid == 0:
                return
            child = next((c for c in self.children if c.pid == info.si_pid), None)
            if child is not None and child.role == "pool":
                end_group(info.si_pid)
            pid, status = os.waitpid(info.si_pid, 0)
            if child is None:
                continue
            child.pid = 0
            self._on_child_exit(child, status)

    def _on_child_exit(self, child: Child, status: int) -> None:
        clean = os.WIFEXITED(status) and os.WEXITSTATUS(status) == ChildExit.RECYCLE
        how = (
            f"exit {os.WEXITSTATUS(status)}"
            if os.WIFEXITED(status)
            else f"signal {os.WTERMSIG(status)}"
        )
        reload = os.WIFEXITED(status) and os.WEXITSTATUS(status) == ChildExit.RELOAD
        if not clean and not reload and child.role != "watcher":  # a watcher claims nothing
            release_claims(self.settings, list(child.worker_ids))
        if self.stopping:
            return
        if reload:
            self.reload = True
            return
        if clean:
            child.crashes = 0
            child.restart_at = time.monotonic()  # recycled on purpose: restart at once
            logger.info("child recycled", role=child.role, pool=child.pool)
            return
        if time.monotonic() - child.started > HEALTHY_AFTER_S:
            child.crashes = 0
        child.crashes += 1
        delay = min(RESTART_BACKOFF_MAX_S, 0.5 * 2 ** (child.crashes - 1))
        child.restart_at = time.monotonic() + delay
        logger.warning(
            "child died, restarting", role=child.role, pool=child.pool, how=how, restart_in_s=delay
        )

    def _restart_due(self) -> None:
        now = time.monotonic()
        for child in self.children:
            if child.pid == 0 and child.restart_at is not None and child.restart_at <= now:
                self._spawn(child)

    # -- shutdown ----------------------------------------------------------------------

    def _shutdown(self) -> int:
        logger.info("shutting down", timeout_s=self.settings.shutdown_timeout_s)
        for child in self.children:
            if child.pid:
                kill(child.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.settings.shutdown_timeout_s + 2.0
        now_sent = False
        next_report = time.monotonic()
        while any(c.pid for c in self.children) and time.monotonic() < deadline:
            self._reap()
            if self.stop_now and not now_sent:
                now_sent = True
                logger.warning("second signal: suspending running jobs now")
                for child in self.children:
                    if child.pid and child.role == "pool":
                        kill(child.pid, signal.SIGUSR1)
            if time.monotonic() >= next_report and not now_sent:
                next_report = time.monotonic() + WAITING_EVERY_S
                self._report_waiting(deadline - 2.0)
            self._sleep(min(0.2, deadline - time.monotonic()))
        stragglers = [c for c in self.children if c.pid]
        for child in stragglers:
            logger.error("child did not stop in time: killing it", pid=child.pid)
            kill(child.pid, signal.SIGKILL)
            if child.role == "pool":
                end_group(child.pid)
            try:
                os.waitpid(child.pid, 0)
            except ChildProcessError:
                pass
        if stragglers:
            release_claims(self.settings, [w for c in stragglers for w in c.worker_ids])
        logger.info("supervisor stopped")
        return 0

    def _report_waiting(self, deadline: float) -> None:
        """Say what the shutdown waits for: the running jobs of our pools, and how long."""
        pools = [w for c in self.children if c.pid and c.role == "pool" for w in c.worker_ids]
        if not pools:
            return
        try:
            store = short_store(self.settings)
            try:
                running = store.running_of_workers(pools)
            finally:
                store.close()
        except Exception as exc:  # only a report: the shutdown goes on
            logger.debug("could not list running jobs", **error_fields(exc))
            return
        if not running:
            return
        shown = ", ".join(f"{name} {job_id[:8]}" for job_id, name in running[:5])
        more = f" and {len(running) - 5} more" if len(running) > 5 else ""
        logger.info(
            MSG_WAITING,
            left_s=max(0, round(deadline - time.monotonic())),
            count=len(running),
            jobs=shown + more,
            hint="Ctrl-C again to suspend them now",
        )


MSG_WAITING = "waiting up to {left_s} s for {count} running job(s): {jobs}"
