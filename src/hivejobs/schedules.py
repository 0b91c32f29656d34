"""Periodic jobs: cron schedules, checked when declared, and the ticks due at a moment.

A schedule enqueues one job of its type per tick. The active coordinator alone enqueues
(coordinator/scheduler.py), and it records the tick it reached in the same transaction, under
its lease, as the jobs it enqueued: a failover or two coordinators for a moment can neither
double a tick nor lose one that fell due while a coordinator led, or one that `catch_up` asks
for. The job id is derived from the schedule and the tick as a second guard. Pure functions
here; croniter parses the expressions.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from hivejobs.errors import InvalidJobType
from hivejobs.records.fleet import ScheduleState

MAX_TICKS_PER_PASS = 100  # a long outage with catch_up is enqueued over several passes


def check_cron(cron: str, tz: str) -> None:
    """Refuse an expression or a time zone that cannot be used, naming which."""
    if not isinstance(cron, str) or not croniter.is_valid(cron):
        raise InvalidJobType(
            f"cron {cron!r} is not a valid cron expression "
            "(5 fields, or 6 with seconds last, e.g. '*/5 * * * *')"
        )
    try:
        ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        raise InvalidJobType(f"tz {tz!r} is not a known time zone (e.g. 'UTC')") from None


def due_ticks(
    state: ScheduleState,
    now: datetime,
    *,
    led_since: datetime | None = None,
    ahead_s: float = 0.0,
) -> list[datetime]:
    """The ticks to enqueue now, oldest first, in UTC: those after the last one enqueued, up
    to `ahead_s` past `now`, at most MAX_TICKS_PER_PASS (the next pass goes on).

    A tick after `led_since` (when the current leader took its lease) fell due, or will, while
    that leader led: it is owed whatever `catch_up` says, however late this pass runs. A tick
    before it was missed while no coordinator led: all are owed with `catch_up`, else only
    the latest. A schedule that never ran starts at its declaration (nothing before is owed).
    """
    since = state.last_tick or state.declared_at
    horizon = now + timedelta(seconds=ahead_s)
    missed_until = now if led_since is None else min(led_since, now)
    it = croniter(state.cron, since.astimezone(ZoneInfo(state.tz)))
    ticks: list[datetime] = []
    while len(ticks) < MAX_TICKS_PER_PASS:
        tick: datetime = it.get_next(datetime)
        if tick > horizon:
            break
        if ticks and tick <= missed_until and not state.catch_up:
            ticks.pop()  # missed ones come first: drop the previous, keep the latest
        ticks.append(tick.astimezone(UTC))
    return ticks


def next_tick(state: ScheduleState, now: datetime) -> datetime:
    """The first tick after `now`, for `hivejobs cron`."""
    next_: datetime = croniter(state.cron, now.astimezone(ZoneInfo(state.tz))).get_next(datetime)
    return next_.astimezone(UTC)


def tick_job_id(schedule: str, tick: datetime) -> str:
    """The id of the job a tick enqueues: the same tick always gives the same id."""
    return f"cron:{schedule}:{tick.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}"
