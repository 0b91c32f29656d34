"""How a pool process stops: the stop state every role reads, and the drain by a deadline.

A stop never fails an at-least-once job and never counts as an attempt (R9 in
docs/concepts/reliability.md): claims not started go back to the queue uncounted, running
attempts get until the deadline to finish, then are suspended. At-most-once attempts that
may have started are failed, never run again. A repeated SIGTERM changes nothing (R10:
Heroku sends it to every process, sometimes more than once).
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from enum import Enum
from typing import TYPE_CHECKING

import msgspec

from hivejobs.config import Settings
from hivejobs.failpoints import failpoint
from hivejobs.records.jobs import ClaimedJob, Completion
from hivejobs.worker.completer import Completer
from hivejobs.worker.executor import interrupted
from hivejobs.worker.exits import ChildExit
from hivejobs.worker.slots import Slots

if TYPE_CHECKING:
    from loguru import Logger

    from hivejobs.worker.fetcher import Fetcher


class StopReason(Enum):
    """Why a pool stops acquiring; the value is what its log lines say."""

    SIGNAL = "signal"  # SIGTERM or SIGINT (from the supervisor, or Heroku to every process)
    TIMED_OUT = "timed out job"  # the watchdog failed an attempt: recycle the process
    POOL_RESTART = "pool restart requested"  # `hivejobs restart --pool`: recycle this pool
    MEMORY_CAP = "memory cap"  # max_rss_mb passed (worker/memory.py): recycle the process
    RELOAD = "restart requested"  # `hivejobs restart`: the supervisor re-execs for new code


class Stop:
    """The pool's stop state: three events and a reason, read by every role without a lock.

    - `acquiring_stopped`: fetch nothing more, then drain (set by a signal, the watchdog or
      a restart message; never cleared).
    - `draining`: the shutdown began: runners start nothing new and a handler's
      Interrupted counts as a suspension.
    - `now`: SIGUSR1 from the supervisor (a second Ctrl-C there): suspend running attempts
      at once instead of waiting for them.
    `reason` is written before `acquiring_stopped` is set; a signal leaves it as it is, so a
    restart asked for before a SIGTERM still reloads.
    """

    def __init__(self) -> None:
        self.acquiring_stopped = threading.Event()
        self.draining = threading.Event()
        self.now = threading.Event()
        self.reason = StopReason.SIGNAL

    def request(self, reason: StopReason) -> None:
        self.reason = reason
        self.acquiring_stopped.set()

    def signal(self) -> None:
        """As on SIGTERM: stop acquiring, finish what runs. Tests call it to stop a pool."""
        self.acquiring_stopped.set()

    def signal_now(self) -> None:
        """As on SIGUSR1: stop acquiring and suspend running attempts without waiting."""
        self.now.set()
        self.acquiring_stopped.set()

    def install_signal_handlers(self) -> None:
        """Main thread only. The handlers only set events: no lock, no logging (the frame
        they interrupt may hold loguru's lock or ours)."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda _signum, _frame: self.signal())
        signal.signal(signal.SIGUSR1, lambda _signum, _frame: self.signal_now())

    @property
    def exit_code(self) -> ChildExit:
        return ChildExit.RELOAD if self.reason is StopReason.RELOAD else ChildExit.RECYCLE


class ShutdownReport(msgspec.Struct, frozen=True, kw_only=True):
    """What a drain did: attempts it took over at the deadline (suspended, or failed when
    at-most-once), claims handed back before they started, and whether every completion
    was written before the pool's exit."""

    taken_over: int
    handed_back: int
    written: bool


class Shutdown:
    """Owns the drain and its deadline (settings.shutdown_timeout_s from its start, under
    Heroku's 30 s). Holds no lock of its own: it reads the slots under `slots.cond`."""

    def __init__(
        self,
        settings: Settings,
        stop: Stop,
        slots: Slots,
        fetcher: Fetcher,
        completer: Completer,
        check_timeouts: Callable[[], None],
        log: Logger,
    ) -> None:
        self.settings = settings
        self.stop = stop
        self.slots = slots
        self.fetcher = fetcher
        self.completer = completer
        self.check_timeouts = check_timeouts  # the lane's Watchdog.check
        self.log = log
        self._handed_back = 0

    def run(self) -> ShutdownReport:
        """Let running jobs finish, then suspend what still runs; return before SIGKILL."""
        settings = self.settings
        deadline = time.monotonic() + settings.shutdown_timeout_s
        self.stop.draining.set()
        # A pop in flight may still claim: let it finish, so no claim outlives this process.
        self.fetcher.join(settings.pop_block_s + 2.0)
        with self.slots.cond:
            busy = len(self.slots.running)
        self.log.info(
            "stopping: finishing running jobs", running=busy, reason=self.stop.reason.value
        )
        soft = deadline - min(settings.stop_grace_s, settings.shutdown_timeout_s / 2)
        self._wait_idle(soft, watch=True)
        with self.slots.cond:
            for r in self.slots.running.values():
                r.ctx.request_stop()
        self._wait_idle(deadline, watch=False)
        stragglers = self.slots.abandon_running()
        for r in stragglers:
            self.completer.submit(self._interrupted(r.job, started=True))
        self._hand_back_unstarted()
        failpoint("pool.after_suspend_write_before_exit")
        written = self.completer.flush(5.0)
        return ShutdownReport(
            taken_over=len(stragglers), handed_back=self._handed_back, written=written
        )

    def _wait_idle(self, until: float, watch: bool) -> None:
        while time.monotonic() < until and not self.stop.now.is_set():
            self._hand_back_unstarted()
            with self.slots.cond:
                if not self.slots.any_running():
                    return
                self.slots.cond.wait(0.1)
            if watch:
                self.check_timeouts()

    def _hand_back_unstarted(self) -> None:
        """Claimed jobs that never started go back to the queue, attempt uncounted."""
        for job in self.slots.drain():
            self._handed_back += 1
            self.completer.submit(self._interrupted(job, started=False))

    def _interrupted(self, job: ClaimedJob, started: bool) -> Completion:
        return interrupted(job, started=started, max_result_bytes=self.settings.max_result_bytes)
