"""Pusher: the ids of acknowledged jobs pushed to Redis off the enqueuing caller's path."""

from __future__ import annotations

import atexit
import os
from collections.abc import Sequence

from hivejobs.batching import Batcher
from hivejobs.broker import Broker
from hivejobs.broker.hints import left_to_reconciler

PUSH_BATCH = 10_000  # ids per pipeline from the Pusher


class Pusher:
    """Pushes ids of acknowledged jobs off the caller's path.

    enqueue returns once Postgres has committed the job (that is the acknowledgement, R1);
    the Redis push is only a hint for speed, so it need not hold the caller up. Pushes that
    arrive while one is in flight go out together in one pipeline. A push lost (Redis down,
    process killed) costs latency only: the coordinator's reconciler re-pushes. Owns one
    Batcher (a queue and its thread) per process: a forked child makes its own on first use.
    """

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self._pid = -1
        self._batcher: Batcher[tuple[str, str, int]] | None = None

    def submit(self, name: str, priority: int, ids: Sequence[str]) -> None:
        batcher = self._batcher
        if self._pid != os.getpid() or batcher is None:
            # First use, or a forked child: threads do not survive a fork.
            self._pid = os.getpid()
            batcher = self._batcher = Batcher(
                self._push, max_batch=PUSH_BATCH, name="hivejobs-pusher"
            )
            batcher.start()
            atexit.register(batcher.flush, 5.0)
        batcher.submit_many([(job_id, name, priority) for job_id in ids])

    def flush(self, timeout_s: float) -> bool:
        """Wait until every submitted id was pushed (or its push failed)."""
        return self._batcher is None or self._batcher.flush(timeout_s)

    def _push(self, entries: list[tuple[str, str, int]]) -> None:
        with left_to_reconciler("enqueued jobs", jobs=len(entries)):
            self.broker.push_many(entries)
