"""One event of a job's stream: ctx.progress and ctx.emit (worker/streaming.py) as readers get
them (client/streaming.py, web/events.py)."""

from __future__ import annotations

from typing import Literal

import msgspec

from hivejobs.records.jobs import JobState

EventKind = Literal["progress", "emit", "end"]


class JobEvent(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One event of a job's stream, as `app.stream` yields it and as it travels on Redis and
    in server-sent events: a progress report (`done` of `total`, `note`), a partial result
    (`data`, with `dropped`: this attempt's emits dropped by the rate limit since the last
    one delivered), or the job's end (`state`, the last event of every stream)."""

    kind: EventKind
    job_id: str
    attempt: int = 0
    done: float | None = None
    total: float | None = None
    note: str | None = None
    data: object = None
    dropped: int = 0
    state: JobState | None = None
