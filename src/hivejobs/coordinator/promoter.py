"""Promoter (leader only): due scheduled jobs and retries whose backoff passed become queued
and their ids go to Redis; waiting jobs that can no longer start (expired, or cancelled
while a retry waited) go to the archive, once a second: an expiry is not a start time, and
every pass of that sweep is a transaction (at five a second it would be the idle
coordinator's largest cost to Postgres)."""

from __future__ import annotations

import time

import msgspec

from hivejobs.broker import Broker
from hivejobs.records.dispatch import Lease
from hivejobs.store import Store

BATCH = 10_000


class PromoteResult(msgspec.Struct):
    """What one pass did: jobs queued, and waiting jobs archived."""

    promoted: int = 0
    ended: int = 0


class Promoter:
    """Owns when the waiting jobs were last swept (`_ended_at`); what is due is read from
    the store at every pass."""

    name = "promote"

    def __init__(
        self, store: Store, broker: Broker, interval_s: float = 1.0, end_every_s: float = 1.0
    ) -> None:
        self.store, self.broker = store, broker
        self.interval_s = interval_s
        self.end_every_s = end_every_s
        self._ended_at = -end_every_s

    def run_once(self, lease: Lease) -> PromoteResult:
        result = PromoteResult()
        pushes = self.store.promote_due_if_leader(lease, BATCH)
        if pushes is None:
            return result  # the lease is lost: the next leader promotes them
        if pushes:
            self.broker.push_many(pushes)
            result.promoted = len(pushes)
        now = time.monotonic()
        if now - self._ended_at >= self.end_every_s:
            self._ended_at = now
            result.ended = self.store.end_waiting_if_leader(lease, BATCH) or 0
        return result
