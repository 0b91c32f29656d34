"""The fleet as operators see it: counts and flow state per job type, worker processes, and
declared schedules."""

from __future__ import annotations

from datetime import datetime

import msgspec


class TypeCounts(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    concurrency: int
    processes: int
    queued: int
    scheduled: int
    running: int
    failed_last_hour: int
    succeeded_last_hour: int
    paused_at: datetime | None = None  # paused fleet-wide since; None: not paused


class TypeFlow(msgspec.Struct, frozen=True, kw_only=True):
    """A job type's flow state as operators steer it: paused fleet-wide since
    `paused_at`, and its runner threads per pool process: `scaled_concurrency` when
    `hivejobs scale` set one, else the code's `concurrency`."""

    name: str
    paused: bool
    paused_at: datetime | None
    concurrency: int
    scaled_concurrency: int | None


class WorkerInfo(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    host: str
    pid: int
    role: str
    pool: str | None
    started_at: datetime
    heartbeat_at: datetime
    heartbeat_age_s: float
    running: int


class Schedule(msgspec.Struct, frozen=True, kw_only=True):
    """A declared schedule: `name` is unique in the fleet; the payload is encoded JSON."""

    name: str
    job_type: str
    cron: str
    tz: str
    payload: bytes
    priority: int
    catch_up: bool


class ScheduleState(Schedule, frozen=True, kw_only=True):
    """A schedule as stored, with the last tick enqueued (None: never ran yet)."""

    declared_at: datetime
    last_tick: datetime | None
