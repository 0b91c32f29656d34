"""Rescuer (leader only): the claims of processes whose heartbeat is older than stuck_after.

At-least-once jobs with attempts left go back to the queue (the attempt counted); the rest
are failed, never re-run. Only once this coordinator has itself been healthy for
stuck_after: after an outage every heartbeat looks stale (rule R6 in
docs/concepts/reliability.md). `rescue_isolated` is shared with the supervisor, which
releases a child's claims the moment it sees the child die (R8).
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec
from loguru import logger

from hivejobs.broker import Broker
from hivejobs.config import Settings
from hivejobs.failpoints import failpoint
from hivejobs.logs import error_fields
from hivejobs.metrics import bump
from hivejobs.records.dispatch import Lease, Rescued
from hivejobs.store import Store, is_data_error

MSG_RESCUE_UNWRITABLE = "claims of a dead process cannot be rescued; other processes' can"
MSG_ARCHIVED_DUPLICATE_RESCUED = (
    "dead process held jobs whose id is already in the archive: the archived record is kept,"
    " the live duplicate removed"
)


class RescueResult(msgspec.Struct):
    """What one pass did; `skipped_unhealthy` when this coordinator cannot judge yet."""

    dead_workers: int = 0
    requeued: int = 0
    failed: int = 0
    skipped_unhealthy: bool = False


class Rescuer:
    """Owns nothing but `healthy_for`, the elector's measure of how long this coordinator
    has seen the database without a gap (0.0 when none is given: it never rescues)."""

    name = "rescue"

    def __init__(
        self,
        store: Store,
        broker: Broker,
        settings: Settings,
        healthy_for: Callable[[], float] | None = None,
    ) -> None:
        self.store, self.broker = store, broker
        self.stuck_after_s = settings.stuck_after_s
        self.poison_after = settings.poison_pill_after
        self.interval_s = settings.coordinator_interval_s
        self.healthy_for = healthy_for or (lambda: 0.0)

    def run_once(self, lease: Lease, healthy_for_s: float | None = None) -> RescueResult:
        """One pass; `healthy_for_s` overrides `healthy_for()` (tests)."""
        healthy = self.healthy_for() if healthy_for_s is None else healthy_for_s
        if healthy < self.stuck_after_s:
            # After an outage every heartbeat looks stale: wait until ours is trustworthy.
            return RescueResult(skipped_unhealthy=True)
        dead = self.store.find_dead_workers(self.stuck_after_s)
        if not dead:
            return RescueResult()
        failpoint("coord.mid_rescue_batch")
        rescued = rescue_isolated(self.store, dead, self.poison_after, lease)
        if rescued is None:
            return RescueResult()
        if rescued.requeued:
            self.broker.push_many(rescued.requeued)
            bump(self.broker, "rescued", [r.name for r in rescued.requeued])
        logger.warning(
            "rescued jobs of dead workers",
            workers=len(dead),
            requeued=len(rescued.requeued),
            failed=rescued.failed,
        )
        return RescueResult(len(dead), len(rescued.requeued), rescued.failed)


def rescue_isolated(
    store: Store, worker_ids: list[str], poison_after: int, lease: Lease | None = None
) -> Rescued | None:
    """Rescue dead processes' claims so that one row that cannot be written blocks only its
    own process's rescue, not every other one: on a data error, one process at a time.
    A connection error propagates (the next pass retries). None when the lease was lost."""
    try:
        rescued = store.rescue_workers(worker_ids, poison_after, lease)
    except Exception as exc:  # classified below
        if not is_data_error(exc):
            raise
        if len(worker_ids) == 1:
            logger.error(MSG_RESCUE_UNWRITABLE, worker_id=worker_ids[0], **error_fields(exc))
            return Rescued(requeued=[], failed=0, archived_duplicates=[])
        parts = [rescue_isolated(store, [w], poison_after, lease) for w in worker_ids]
        if any(p is None for p in parts):
            return None
        rescued = Rescued(
            requeued=[r for p in parts if p for r in p.requeued],
            failed=sum(p.failed for p in parts if p),
            archived_duplicates=[d for p in parts if p for d in p.archived_duplicates],
        )
    if rescued is not None and rescued.archived_duplicates:
        logger.error(
            MSG_ARCHIVED_DUPLICATE_RESCUED,
            jobs=len(rescued.archived_duplicates),
            job_ids=rescued.archived_duplicates[:20],
        )
    return rescued
