"""Finding jobs after the fact: `app.list_jobs` over live and archived jobs, and the options
a replay keeps (rickover's replay), plus the time expressions the CLI takes ("1h", ISO).

Checks arguments and shapes pages; the SQL is in store/archive.sql. Never reads payloads for
a listing: a page shows what happened to jobs, not what they carried.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, get_args

from hivejobs.errors import InvalidArgument
from hivejobs.records.jobs import JobInfo, JobPage, JobState
from hivejobs.store.archive import list_jobs as store_list_jobs

if TYPE_CHECKING:
    from hivejobs.store import Store

MAX_PAGE = 10_000
_STATES = set(get_args(JobState))
_SPAN_RE = re.compile(r"^(\d+(?:\.\d+)?)(s|m|h|d|w)$")
_SPAN_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
# A replayed job's original delay: run_at - created_at, when its run_at was never moved
# by a retry or a suspension (both set run_at = now() + wait).
MIN_DELAY_S = 0.5


def list_jobs(
    store: Store,
    state: str | Sequence[str] | None,
    type_: str | None,
    since: datetime | timedelta | None,
    until: datetime | None,
    limit: int,
    after: str | None,
) -> JobPage:
    states = [state] if isinstance(state, str) else list(state or ())
    unknown = [s for s in states if s not in _STATES]
    if unknown:
        raise InvalidArgument(
            f"unknown job state {unknown[0]!r} (states: {', '.join(sorted(_STATES))})"
        )
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
        raise InvalidArgument(f"limit must be 1-{MAX_PAGE}, not {limit!r}")
    for label, moment in (("since", since), ("until", until)):
        if isinstance(moment, datetime) and moment.tzinfo is None:
            raise InvalidArgument(f"{label} must be timezone-aware (e.g. datetime.now(UTC))")
    jobs = store_list_jobs(
        store,
        states=states or None,
        name=type_,
        since=since if isinstance(since, datetime) else None,
        since_s=since.total_seconds() if isinstance(since, timedelta) else None,
        until=until,
        after=_parse_cursor(after),
        limit=limit,
    )
    last = jobs[-1] if len(jobs) == limit else None
    return JobPage(jobs=jobs, next=None if last is None else f"{last.at.isoformat()} {last.id}")


def _parse_cursor(cursor: str | None) -> tuple[datetime, str] | None:
    if cursor is None:
        return None
    at, _, job_id = cursor.partition(" ")
    try:
        return datetime.fromisoformat(at), job_id
    except ValueError:
        raise InvalidArgument(f"{cursor!r} is not a page cursor (use a page's `next`)") from None


@dataclass
class ReplayPlan:
    priority: int
    delay_s: float | None
    expires_at: datetime | None
    changes: list[str] = field(default_factory=list)


def replay_options(info: JobInfo, now: datetime) -> ReplayPlan:
    """The original's options, relative to now; every difference is named in `changes`."""
    plan = ReplayPlan(priority=info.priority, delay_s=None, expires_at=None)
    waited = (info.run_at - info.created_at).total_seconds()
    if info.attempt <= 1 and waited >= MIN_DELAY_S:
        plan.delay_s = round(waited, 3)
        plan.changes.append(f"run_at: {plan.delay_s:g}s from now, as the original's delay")
    elif info.attempt > 1 and waited >= MIN_DELAY_S:
        plan.changes.append(
            "no delay: the original's first run time was moved by its retries, so its "
            "delay is unknown"
        )
    if info.expires_at is not None:
        lifetime = info.expires_at - info.created_at
        if info.expires_at > now + timedelta(seconds=1):
            plan.expires_at = info.expires_at
        else:
            # At least a second: a job that would expire while being enqueued is refused.
            plan.expires_at = now + max(lifetime, timedelta(seconds=1))
            plan.changes.append(
                f"expires_at: {plan.expires_at.isoformat(timespec='seconds')} (the original's "
                f"had passed; same lifetime of {lifetime.total_seconds():g}s from now)"
            )
    return plan


def parse_moment(text: str, now: datetime | None = None) -> datetime:
    """CLI times: a span back from now ("90s", "15m", "1h", "2d") or an ISO 8601 moment
    (UTC when it names no zone)."""
    span = parse_span(text)
    if span is not None:
        return (now or datetime.now(UTC)) - span
    return parse_iso(text)


def parse_span(text: str) -> timedelta | None:
    found = _SPAN_RE.match(text.strip())
    if found is None:
        return None
    return timedelta(seconds=float(found.group(1)) * _SPAN_S[found.group(2)])


def parse_iso(text: str) -> datetime:
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise InvalidArgument(
            f"{text!r} is neither a span (30s, 15m, 1h, 2d) nor an ISO 8601 time"
        ) from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
