"""Scheduler: the active coordinator enqueues one job per tick of every periodic schedule.

Ticks are judged on the database clock. A tick's job and the schedule's new last tick commit
together under the lease, so exactly one enqueue per tick survives failover; ids derived from
the tick (schedules.tick_job_id) are the second guard.
"""

from __future__ import annotations

from datetime import datetime

from loguru import logger

from hivejobs.broker import Broker
from hivejobs.records import JobTypeInfo, Lease, NewJob
from hivejobs.schedules import ScheduleState, due_ticks, tick_job_id
from hivejobs.store import Store
from hivejobs.store.schedules import ScheduleStore


class Scheduler:
    """Owns nothing but its view of the schedules, re-read every pass."""

    name = "schedule"

    def __init__(self, store: Store, broker: Broker, interval_s: float = 1.0) -> None:
        self.schedules = ScheduleStore(store)
        self.store = store
        self.broker = broker
        self.interval_s = interval_s

    def run_once(self, lease: Lease) -> int:
        """Enqueue what is due; returns the number of jobs enqueued."""
        states = self.schedules.states()
        if not states:
            return 0
        types = {t.name: t for t in self.store.job_types()}
        now = self.schedules.now()
        enqueued = 0
        for state in states:
            ticks = due_ticks(state, now)
            jt = types.get(state.job_type)
            if not ticks or jt is None:
                continue
            jobs = [_tick_job(state, tick, jt) for tick in ticks]
            pushes = self.schedules.enqueue_ticks_if_leader(lease, state, jobs, ticks[-1])
            if pushes is None:
                return enqueued  # the lease is lost: the next leader carries on
            if pushes:
                self.broker.push_many(pushes)
            enqueued += len(pushes)
            logger.debug("schedule ticks enqueued", schedule=state.name, jobs=len(pushes))
        return enqueued


def _tick_job(state: ScheduleState, tick: datetime, jt: JobTypeInfo) -> NewJob:
    return NewJob(
        id=tick_job_id(state.name, tick),
        name=state.job_type,
        priority=state.priority,
        attempts=jt.attempts,
        delivery=jt.delivery,
        payload=state.payload,
        delay_s=None,
        run_at=None,
        expires_at=None,
    )
