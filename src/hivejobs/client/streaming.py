"""`app.stream(job_id)` and `app.astream(job_id)`: a job's progress, partial results and end.

A stream subscribes to the job's Redis channel first, then watches for its end as
`app.wait` does (a LISTEN session woken by the archiving NOTIFY; without one, a read of the
job every POLL_S), then reads the last stored progress and yields it: a reader who comes
late starts from where the job got to, and misses nothing published after it subscribed.
The live events follow as they come; the job's end (read from Postgres, the truth) is the
last event. Before it, the final stored progress is yielded if the live ones did not end
on it (a pub/sub message may lose the race with the NOTIFY). Redis down: no live events,
the stream still starts from the stored progress and ends with the job. Never changes a
job.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Protocol

import redis
from loguru import logger

from hivejobs.broker.aio import AsyncEventSubscription
from hivejobs.broker.channels import EventSubscription
from hivejobs.client import waiting
from hivejobs.client.connections import Connections
from hivejobs.client.waiting import POLL_S, JobReader, checked_timeout, listen_url
from hivejobs.errors import WaitTimeout
from hivejobs.jobtypes import check_id
from hivejobs.logs import error_fields
from hivejobs.records.events import JobEvent
from hivejobs.records.jobs import TERMINAL_STATES, JobInfo
from hivejobs.store.progress import get_progress
from hivejobs.store.waits import AsyncWatch, Watch

LISTEN_TURN_S = 0.5  # how soon a stream's helper threads notice that it was closed
_CHECK = None  # on a stream's queue: "the job may have ended, read it"


class App(JobReader, Protocol):
    """What a stream needs of the App: a wait's reads and its connections."""

    @property
    def connections(self) -> Connections: ...


def end_event(info: JobInfo) -> JobEvent:
    return JobEvent(kind="end", job_id=info.id, attempt=info.attempt, state=info.state)


def _same_progress(a: JobEvent | None, b: JobEvent) -> bool:
    return a is not None and (a.attempt, a.done, a.total, a.note) == (
        b.attempt,
        b.done,
        b.total,
        b.note,
    )


def stream(app: App, job_id: str, timeout: float | None) -> Iterator[JobEvent]:
    limit = checked_timeout(timeout)
    deadline = time.monotonic() + limit
    info = app.get_job(job_id)  # JobNotFound before anything is opened
    if info.state in TERMINAL_STATES:
        stored = get_progress(app.connections.store, job_id)
        if stored is not None:
            yield stored
        yield end_event(info)
        return
    items: queue.Queue[JobEvent | None] = queue.Queue()
    stop = threading.Event()
    subscription = _subscribe(app, job_id)
    url = listen_url(app)
    watch = Watch(url, job_id) if url is not None else None
    helpers = [threading.Thread(target=_watch, args=(app, job_id, watch, items, stop))]
    if subscription is not None:
        helpers.append(threading.Thread(target=_listen, args=(subscription, items, stop)))
    last: JobEvent | None = None
    try:
        stored = get_progress(app.connections.store, job_id)
        if stored is not None:
            last = stored
            yield stored
        info = app.get_job(job_id)  # after the watch: an end from now on wakes us
        for helper in helpers:
            helper.daemon = True
            helper.start()
        while info.state not in TERMINAL_STATES:
            left = deadline - time.monotonic()
            if left <= 0:
                raise WaitTimeout(job_id, limit, info.state)
            try:
                item = items.get(timeout=min(left, 3600.0))
            except queue.Empty:
                continue
            if item is _CHECK:
                info = app.get_job(job_id)
                continue
            if item.kind == "progress":
                if _same_progress(last, item):
                    continue  # the report just read from Postgres, arriving live too
                last = item
            yield item
        stop.set()
        for helper in helpers:
            helper.join()
        tail = [i for i in _drained(items) if i is not None]
        if subscription is not None:
            tail += list(iter(lambda: subscription.get(0.0), None))
        final = get_progress(app.connections.store, job_id)
        closing = _closing(tail, last, final, info)
    finally:
        stop.set()
        for helper in helpers:
            if helper.is_alive():
                helper.join()
        if subscription is not None:
            subscription.close()
        if watch is not None:
            watch.__exit__(None, None, None)
    # After the cleanup: a reader that stops at the end event leaves nothing open.
    yield from closing


def _closing(
    tail: list[JobEvent], last: JobEvent | None, final: JobEvent | None, info: JobInfo
) -> list[JobEvent]:
    """The stream's last events: what came before the end was seen, the stored progress
    if the live ones did not end on it, and the end."""
    out = []
    for item in tail:
        if item.kind == "progress":
            if _same_progress(last, item):
                continue
            last = item
        out.append(item)
    if final is not None and not _same_progress(last, final):
        out.append(final)
    return [*out, end_event(info)]


def _subscribe(app: App, job_id: str) -> EventSubscription | None:
    try:
        return app.connections.broker.subscribe_events(job_id)
    except redis.RedisError as exc:
        logger.warning("job stream without live events: Redis", job_id=job_id, **error_fields(exc))
        return None


def _drained(items: queue.Queue[JobEvent | None]) -> list[JobEvent | None]:
    out = []
    with contextlib.suppress(queue.Empty):
        while True:
            out.append(items.get_nowait())
    return out


def _listen(
    subscription: EventSubscription, items: queue.Queue[JobEvent | None], stop: threading.Event
) -> None:
    """Live events to the queue until the stream stops (a thread of the stream's own)."""
    while not stop.is_set():
        try:
            event = subscription.get(LISTEN_TURN_S)
        except redis.RedisError as exc:
            logger.warning("job stream lost its live events", **error_fields(exc))
            return
        if event is not None:
            items.put(event)


def _watch(
    app: App,
    job_id: str,
    watch: Watch | None,
    items: queue.Queue[JobEvent | None],
    stop: threading.Event,
) -> None:
    """A check on the queue whenever the job may have ended (a thread of the stream's own):
    the NOTIFY of its archiving, or without a LISTEN session every POLL_S."""
    while not stop.is_set():
        if watch is None:
            if stop.wait(POLL_S):
                return
            items.put(_CHECK)
        elif watch.woken(LISTEN_TURN_S):
            items.put(_CHECK)


async def astream(app: App, job_id: str, timeout: float | None) -> AsyncIterator[JobEvent]:
    limit = checked_timeout(timeout)
    deadline = time.monotonic() + limit
    info = await app.aget_job(job_id)
    backends = await app.connections.async_backends()
    if info.state in TERMINAL_STATES:
        stored = await backends.store.get_progress(job_id)
        if stored is not None:
            yield stored
        yield end_event(info)
        return
    items: asyncio.Queue[JobEvent | None] = asyncio.Queue()
    try:
        subscription: AsyncEventSubscription | None = await backends.broker.subscribe_events(job_id)
    except redis.RedisError as exc:
        logger.warning("job stream without live events: Redis", job_id=job_id, **error_fields(exc))
        subscription = None
    url = listen_url(app)
    watch = await AsyncWatch.open(url, job_id) if url is not None else None
    helpers: list[asyncio.Task[None]] = []
    last: JobEvent | None = None
    try:
        stored = await backends.store.get_progress(job_id)
        if stored is not None:
            last = stored
            yield stored
        info = await app.aget_job(job_id)
        helpers.append(asyncio.create_task(_awatch(watch, items)))
        if subscription is not None:
            helpers.append(asyncio.create_task(_alisten(subscription, items)))
        while info.state not in TERMINAL_STATES:
            left = deadline - time.monotonic()
            if left <= 0:
                raise WaitTimeout(job_id, limit, info.state)
            try:
                item = await asyncio.wait_for(items.get(), min(left, 3600.0))
            except TimeoutError:
                continue
            if item is _CHECK:
                info = await app.aget_job(job_id)
                continue
            if item.kind == "progress":
                if _same_progress(last, item):
                    continue  # the report just read from Postgres, arriving live too
                last = item
            yield item
        await _cancelled(helpers)
        tail: list[JobEvent] = []
        while not items.empty():
            item = items.get_nowait()
            if item is not None:
                tail.append(item)
        if subscription is not None:
            while (event := await subscription.get(0.0)) is not None:
                tail.append(event)
        final = await backends.store.get_progress(job_id)
        closing = _closing(tail, last, final, info)
    finally:
        await _cancelled(helpers)
        if subscription is not None:
            await subscription.close()
        if watch is not None:
            await watch.close()
    for item in closing:
        yield item


async def _cancelled(tasks: list[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _alisten(
    subscription: AsyncEventSubscription, items: asyncio.Queue[JobEvent | None]
) -> None:
    try:
        while True:
            event = await subscription.get(3600.0)
            if event is not None:
                items.put_nowait(event)
    except redis.RedisError as exc:
        logger.warning("job stream lost its live events", **error_fields(exc))


async def _awatch(watch: AsyncWatch | None, items: asyncio.Queue[JobEvent | None]) -> None:
    while True:
        if watch is None:
            await asyncio.sleep(POLL_S)
            items.put_nowait(_CHECK)
        elif await watch.woken(3600.0):
            items.put_nowait(_CHECK)


def wait_with_progress(
    app: App, job_id: str, timeout: float | None, on_progress: Callable[[JobEvent], object]
) -> JobInfo:
    """`app.wait(..., on_progress=f)`: f(event) for each progress and partial result."""
    for event in stream(app, job_id, timeout):
        if event.kind != "end":
            on_progress(event)
    return app.get_job(job_id)


async def await_with_progress(
    app: App, job_id: str, timeout: float | None, on_progress: Callable[[JobEvent], object]
) -> JobInfo:
    """`await app.await_job(..., on_progress=f)`: f may be a coroutine function."""
    async for event in astream(app, job_id, timeout):
        if event.kind != "end":
            outcome = on_progress(event)
            if asyncio.iscoroutine(outcome):
                await outcome
    return await app.aget_job(job_id)


class Streams:
    """The App's calls that wait for a job or follow its events (a part of the App's
    facade); `App` above is what they need of it."""

    def wait(
        self: App,
        job_id: str,
        timeout: float | None = None,
        *,
        on_progress: Callable[[JobEvent], object] | None = None,
    ) -> JobInfo:
        """Block until the job finishes and return it (state, attempt, error, result).
        Woken by a Postgres NOTIFY when it is archived, not by polling. Raises WaitTimeout
        after `timeout` seconds (None: no limit), JobNotFound for an unknown id.
        `on_progress`: called with each progress report and partial result (JobEvent) as
        the job sends them, the last stored progress first (see `stream`)."""
        check_id(job_id)
        if on_progress is not None:
            return wait_with_progress(self, job_id, timeout, on_progress)
        return waiting.wait(self, job_id, timeout)

    async def await_job(
        self: App,
        job_id: str,
        timeout: float | None = None,
        *,
        on_progress: Callable[[JobEvent], object] | None = None,
    ) -> JobInfo:
        """`wait` for event loops: `info = await app.await_job(job_id, timeout=30)`;
        `on_progress` may be a coroutine function."""
        check_id(job_id)
        if on_progress is not None:
            return await await_with_progress(self, job_id, timeout, on_progress)
        return await waiting.await_job(self, job_id, timeout)

    def stream(self: App, job_id: str, timeout: float | None = None) -> Iterator[JobEvent]:
        """The job's events until it ends: its last stored progress first (a late reader
        sees where it got to), then each progress and partial result as the job sends them
        (ctx.progress, ctx.emit), then one `kind="end"` event with its final state. Raises
        WaitTimeout after `timeout` seconds (None: no limit), JobNotFound for an unknown
        id. Close the iterator (or leave the loop) to stop early."""
        check_id(job_id)
        return stream(self, job_id, timeout)

    def astream(self: App, job_id: str, timeout: float | None = None) -> AsyncIterator[JobEvent]:
        """`stream` for event loops: `async for event in app.astream(job_id): ...`."""
        check_id(job_id)
        return astream(self, job_id, timeout)

    def progress(self: App, job_id: str) -> JobEvent | None:
        """The job's last stored progress (at most a second behind the live one while it
        runs, its last when it ended), None if it reported none."""
        check_id(job_id)
        return get_progress(self.connections.store, job_id)
