"""`app.wait` and `app.await_job`: block until a job finishes, without polling.

A wait reads the job, and while it is not finished sleeps on a LISTEN session until the
archiving transaction's NOTIFY names it (store/waits.py), then reads it again: Postgres is
the truth, the NOTIFY a wake-up. Behind a transaction-mode pooler with no listen URL there
is no session to LISTEN on; the wait then reads the job every POLL_S instead. Never changes
a job.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

from hivejobs.errors import InvalidArgument, WaitTimeout
from hivejobs.records.jobs import TERMINAL_STATES, JobInfo
from hivejobs.store.waits import AsyncWatch, Watch

if TYPE_CHECKING:
    from hivejobs.config import Settings

POLL_S = 0.5  # only without a LISTEN session (a pooler and no listen_database_url)


def checked_timeout(timeout: float | None) -> float:
    """Seconds to wait at most (inf for None), or InvalidArgument."""
    if timeout is None:
        return math.inf
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout >= 0:
        raise InvalidArgument(f"timeout must be seconds >= 0 or None, not {timeout!r}")
    return float(timeout)


class JobReader(Protocol):
    """What a wait needs of the App: its settings and its reads of one job."""

    settings: Settings

    def get_job(self, job_id: str) -> JobInfo: ...

    async def aget_job(self, job_id: str) -> JobInfo: ...


def listen_url(app: JobReader) -> str | None:
    from hivejobs.coordinator import listen_url as coordinator_listen_url

    return coordinator_listen_url(app.settings)


def wait(app: JobReader, job_id: str, timeout: float | None) -> JobInfo:
    limit = checked_timeout(timeout)
    deadline = time.monotonic() + limit
    info = app.get_job(job_id)  # JobNotFound before any session is opened
    if info.state in TERMINAL_STATES:
        return info
    url = listen_url(app)
    if url is None:
        return _poll(lambda: app.get_job(job_id), deadline, limit, time.sleep)
    with Watch(url, job_id) as watch:
        info = app.get_job(job_id)  # after the watch: a finish from now on wakes us
        while info.state not in TERMINAL_STATES:
            left = deadline - time.monotonic()
            if left <= 0:
                raise WaitTimeout(job_id, limit, info.state)
            if watch.woken(min(left, 3600.0)):
                info = app.get_job(job_id)
    return info


async def await_job(app: JobReader, job_id: str, timeout: float | None) -> JobInfo:
    limit = checked_timeout(timeout)
    deadline = time.monotonic() + limit
    info = await app.aget_job(job_id)
    if info.state in TERMINAL_STATES:
        return info
    url = listen_url(app)
    if url is None:
        return await _apoll(lambda: app.aget_job(job_id), deadline, limit)
    watch = await AsyncWatch.open(url, job_id)
    try:
        info = await app.aget_job(job_id)
        while info.state not in TERMINAL_STATES:
            left = deadline - time.monotonic()
            if left <= 0:
                raise WaitTimeout(job_id, limit, info.state)
            if await watch.woken(min(left, 3600.0)):
                info = await app.aget_job(job_id)
        return info
    finally:
        await watch.close()


def _poll(
    read: Callable[[], JobInfo], deadline: float, limit: float, sleep: Callable[[float], None]
) -> JobInfo:
    while True:
        info = read()
        if info.state in TERMINAL_STATES:
            return info
        left = deadline - time.monotonic()
        if left <= 0:
            raise WaitTimeout(info.id, limit, info.state)
        sleep(min(POLL_S, left))


async def _apoll(read: Callable[[], Awaitable[JobInfo]], deadline: float, limit: float) -> JobInfo:
    while True:
        info = await read()
        if info.state in TERMINAL_STATES:
            return info
        left = deadline - time.monotonic()
        if left <= 0:
            raise WaitTimeout(info.id, limit, info.state)
        await asyncio.sleep(min(POLL_S, left))
