"""Leader lease in Postgres with a term and a local trust window (after River's elector; rule
R7 of docs/concepts/reliability.md, whose rule numbers the comments here use).

The lease is renewed on the database clock; locally we trust it only until the monotonic
window (TTL - margin) since the last successful renewal passes, so a paused or partitioned
leader steps down before anyone else can take over. Never performs coordinator work itself.
"""

from __future__ import annotations

import time

import psycopg
from loguru import logger

from hivejobs.config import Settings
from hivejobs.logs import error_fields
from hivejobs.records.dispatch import Lease
from hivejobs.store import Store

STALL_S = 3.0  # the loop ticks every fraction of a second; a longer gap is a stall


class Elector:
    """Owns this coordinator's view of the lease: `term` (None: not leading), the monotonic
    end of the trust window, and since when the database has answered without a gap
    (`healthy_since`, which the rescuer waits on). Touched only by the coordinator's loop,
    except `term`, which the pruner's thread reads to stop once leadership is gone."""

    def __init__(self, store: Store, holder: str, settings: Settings) -> None:
        self.store = store
        self.holder = holder
        self.ttl_s = settings.lease_ttl_s
        self.renew_s = settings.lease_renew_s
        self.margin_s = settings.lease_margin_s
        self.term: int | None = None
        self._trusted_until = 0.0
        self._next_attempt = 0.0
        self.healthy_since: float | None = None
        self._last_tick = time.monotonic()

    def tick(self) -> None:
        """Acquire or renew when due; keeps `term` and the trust window current."""
        now = time.monotonic()
        if now - self._last_tick > STALL_S:
            # We were stopped or starved (SIGSTOP, VM pause): we observed nothing meanwhile,
            # so every heartbeat may look stale. Health starts over (R6).
            self.healthy_since = None
        self._last_tick = now
        if now < self._next_attempt:
            return
        try:
            term = self.store.lease_acquire(self.holder, self.ttl_s)
        except psycopg.errors.LockNotAvailable:
            # The holder is mid-transaction (or paused there until Postgres ends it): the
            # database answered, so our health stands; try again shortly.
            term = None
        except psycopg.Error as exc:
            self.healthy_since = None
            self._next_attempt = now + 0.5
            logger.warning("lease renewal failed", **error_fields(exc))
            return
        if self.healthy_since is None:
            self.healthy_since = now
        if term is None:
            if self.term is not None:
                logger.warning("lease lost to another coordinator", term=self.term)
            self.term = None
            self._next_attempt = now + min(self.renew_s, 1.0)
            return
        if term != self.term:
            logger.info("became the active coordinator", term=term)
        self.term = term
        self._trusted_until = now + self.ttl_s - self.margin_s
        self._next_attempt = now + self.renew_s

    @property
    def lease(self) -> Lease | None:
        """(holder, term) while the local trust window lasts, else None: step down."""
        if self.term is None:
            return None
        if time.monotonic() >= self._trusted_until:
            logger.warning(
                "lease trust window passed without renewal: stepping down", term=self.term
            )
            self.term = None
            return None
        return Lease(self.holder, self.term)

    def healthy_for(self) -> float:
        return 0.0 if self.healthy_since is None else time.monotonic() - self.healthy_since

    def resign(self) -> None:
        if self.term is None:
            return
        try:
            self.store.lease_resign(self.holder)
            logger.info("resigned the lease", term=self.term)
        except psycopg.Error as exc:
            logger.warning("could not resign the lease", **error_fields(exc))
        self.term = None
