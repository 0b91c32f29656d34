"""CallbackTimeouts (leader only): ends callback jobs whose status callback never came.

A callback type's job waits without a worker, so no rescue finds it; its deadline (set when its
handler returned, `callback_timeout` of the type) does. Past it the attempt counts as failed:
retried after the default backoff while attempts are left (at-least-once), else failed.
"""

from __future__ import annotations

import msgspec
from loguru import logger

from hivejobs.broker import Broker
from hivejobs.metrics import bump
from hivejobs.records.dispatch import Lease
from hivejobs.store import Store
from hivejobs.store.callbacks import CallbackStore

BATCH = 1000


class TimeoutResult(msgspec.Struct):
    """What one pass ended: jobs retried and jobs failed for want of a callback."""

    retried: int = 0
    failed: int = 0


class CallbackTimeouts:
    """Owns nothing: the deadlines are in the rows."""

    name = "callbacks"

    def __init__(self, store: Store, broker: Broker, interval_s: float = 1.0) -> None:
        self.callbacks = CallbackStore(store)
        self.broker = broker
        self.interval_s = interval_s

    def run_once(self, lease: Lease) -> TimeoutResult:
        ended = self.callbacks.end_timed_out_if_leader(lease, BATCH)
        if ended is None or not (ended.retried or ended.failed):
            return TimeoutResult()  # the lease is lost, or nothing timed out
        retried, failed = ended
        bump(self.broker, "retried", retried)
        bump(self.broker, "failed", failed, "failed")
        logger.warning("status callbacks timed out", retried=len(retried), failed=len(failed))
        return TimeoutResult(len(retried), len(failed))
