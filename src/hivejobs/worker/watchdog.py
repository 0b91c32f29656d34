"""Job timeouts of a pool process, rickover's rule: past `timeout`, ask the attempt to stop;
past timeout + grace, fail the attempt and recycle the process (a Python thread cannot be
killed, so only a fresh process frees its runner).

Never waits on a job; runs in the pool's main thread (and in the shutdown's first wait).
"""

from __future__ import annotations

import time

from hivejobs.config import Settings
from hivejobs.jobtypes import JobType
from hivejobs.worker.completer import Completer
from hivejobs.worker.executor import failed
from hivejobs.worker.shutdown import Stop, StopReason
from hivejobs.worker.slots import Running, Slots


class Watchdog:
    """Owns no state: it reads the running attempts under `slots.cond`, marks the ones it
    ends `abandoned` there (so their runner drops its own result), writes their failure
    through the completer and asks the pool to stop acquiring (StopReason.TIMED_OUT)."""

    def __init__(
        self, jt: JobType, settings: Settings, slots: Slots, completer: Completer, stop: Stop
    ) -> None:
        self.jt = jt
        self.settings = settings
        self.slots = slots
        self.completer = completer
        self.stop = stop

    def check(self) -> None:
        """One pass over the running attempts."""
        timeout = self.jt.timeout_s
        if timeout is None:
            return
        now = time.monotonic()
        reason = f"timed out after {timeout:g}s"
        expired: list[Running] = []
        with self.slots.cond:
            for r in self.slots.running.values():
                age = now - r.started
                if age > timeout and not r.ctx.stop_requested:
                    r.ctx.request_stop(reason)
                if age > timeout + self.settings.timeout_grace_s and not r.abandoned:
                    r.abandoned = True
                    expired.append(r)
        for r in expired:
            r.ctx.logger.error("attempt timed out; recycling the pool", timeout_s=timeout)
            self.completer.submit(
                failed(
                    r.job,
                    r.ctx,
                    reason,
                    self.jt.backoff.delay_s(r.job.attempt),
                    self.settings.max_result_bytes,
                )
            )
        if expired and not self.stop.acquiring_stopped.is_set():
            self.stop.request(StopReason.TIMED_OUT)
