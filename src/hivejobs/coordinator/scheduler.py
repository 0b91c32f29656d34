"""Scheduler: the active coordinator enqueues one job per tick of every periodic schedule.

Ticks are judged on the database clock. A tick's job and the schedule's new last tick commit
together under the lease, so exactly one enqueue per tick survives failover; ids derived from
the tick (schedules.tick_job_id) are the second guard.

A pass runs about once a second, not on the tick, so it owes every tick since the last one
enqueued that fell due while this leader held the lease (schedules.due_ticks): one pass that
lands just past a boundary runs both ticks, not the later alone. A tick's job is written up to
WRITE_AHEAD_S before its tick, as a scheduled job that the promoter queues at the tick: a tick
that falls due while a leader lives already has its job when that leader dies (kill -9) before
its next pass, and the job starts on the tick rather than at the next pass.
"""

from __future__ import annotations

from datetime import datetime

from loguru import logger

from hivejobs.broker import Broker
from hivejobs.coordinator.elector import STALL_S
from hivejobs.records.dispatch import Lease
from hivejobs.records.fleet import ScheduleState
from hivejobs.records.jobs import JobTypeInfo, NewJob
from hivejobs.schedules import due_ticks, tick_job_id
from hivejobs.store import Store
from hivejobs.store.schedules import ScheduleStore

# A leader's passes are a second apart; one whose loop went longer is stalled (the elector
# counts it unhealthy), so writing this far ahead covers every tick of a healthy leader.
WRITE_AHEAD_S = STALL_S


class Scheduler:
    """Owns nothing but its view of the schedules, re-read every pass."""

    name = "schedule"

    def __init__(
        self,
        store: Store,
        broker: Broker,
        interval_s: float = 1.0,
        ahead_s: float = WRITE_AHEAD_S,
    ) -> None:
        self.schedules = ScheduleStore(store)
        self.store = store
        self.broker = broker
        self.interval_s = interval_s
        self.ahead_s = ahead_s

    def run_once(self, lease: Lease) -> int:
        """Enqueue what is due; returns the number of jobs enqueued."""
        states = self.schedules.states()
        if not states:
            return 0
        now, led_since = self.schedules.clock(lease)
        if led_since is None:
            return 0  # the lease is lost: the next leader carries on
        types = {t.name: t for t in self.store.job_types()}
        enqueued = 0
        for state in states:
            ticks = due_ticks(state, now, led_since=led_since, ahead_s=self.ahead_s)
            jt = types.get(state.job_type)
            if not ticks or jt is None:
                continue
            jobs = [_tick_job(state, tick, jt, now) for tick in ticks]
            pushes = self.schedules.enqueue_ticks_if_leader(lease, state, jobs, ticks[-1])
            if pushes is None:
                return enqueued  # the lease is lost: the next leader carries on
            if pushes:
                self.broker.push_many(pushes)
            enqueued += len(pushes)
            logger.debug("schedule ticks enqueued", schedule=state.name, jobs=len(pushes))
        return enqueued


def _tick_job(state: ScheduleState, tick: datetime, jt: JobTypeInfo, now: datetime) -> NewJob:
    """A tick still ahead waits as a scheduled job until the tick (the promoter queues it)."""
    return NewJob(
        id=tick_job_id(state.name, tick),
        name=state.job_type,
        priority=state.priority,
        attempts=jt.attempts,
        delivery=jt.delivery,
        payload=state.payload,
        delay_s=None,
        run_at=tick if tick > now else None,
        expires_at=None,
    )
