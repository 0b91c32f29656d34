"""AttemptContext: what the worker knows of the attempt a handler runs, and how it is told to stop.

The worker builds one per attempt through the served App's `job_context` (worker/served.py),
which returns the public JobContext (client/app.py): this base holds what the worker
reads and drives (identity, stop flag, logger, streamed events); the subclass adds what only
a handler uses (the App, its chain, its batch). Never imports client/.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from loguru import logger

from hivejobs.records.jobs import ClaimedJob

if TYPE_CHECKING:
    from loguru import Logger

    from hivejobs.worker.streaming import EventSink


class AttemptContext:
    """The attempt's identity, its stop flag and its event sink: the part of a handler's
    JobContext the pool reads and drives.

    `stopping` is set when the worker shuts down, the job is cancelled, or its timeout passed:
    a long handler should check it and raise `hivejobs.Interrupted` (or return) promptly.
    Owns the stop flag (set from any pool thread: `request_stop` records the request before
    the event exists, `stopping` sets the event after publishing it, so no request is lost).
    """

    def __init__(self, job: ClaimedJob, events: EventSink | None = None) -> None:
        self.job_id = job.id
        self.name = job.name
        self.attempt = job.attempt
        self.attempts = job.attempts
        self.priority = job.priority
        self.delivery = job.delivery
        self._stopping: threading.Event | None = None  # made on first use: most jobs never ask
        self._stop_requested = False
        # Why the stop was asked when it is the attempt's failure (the watchdog's timeout):
        # the error of an attempt that ends on that stop, whatever the handler raised to end.
        self.stop_reason: str | None = None
        self._on_stop: Callable[[], object] | None = None
        self.cancelled = False
        self._logger: Logger | None = None
        self._events = events

    @property
    def stopping(self) -> threading.Event:
        """Set when this attempt should stop: shutdown, cancel, or its timeout passed."""
        event = self._stopping
        if event is None:
            event = threading.Event()
            self._stopping = event
        if self._stop_requested:  # checked after publishing: a concurrent request is not lost
            event.set()
        return event

    def request_stop(self, reason: str | None = None) -> None:
        """Called by the pool (any thread): sets `stopping`, now or when first looked at, and
        calls the on_stop callback (now or when it is given). The first `reason` given is
        kept as stop_reason."""
        if reason is not None and self.stop_reason is None:
            self.stop_reason = reason
        self._stop_requested = True
        event = self._stopping
        if event is not None:
            event.set()
        callback = self._on_stop
        if callback is not None:
            callback()

    def on_stop(self, callback: Callable[[], object]) -> None:
        """Call `callback` (from the requesting thread) once a stop is requested: how a stop
        reaches an `async def` handler's task as cancellation, without anyone polling
        `stopping`. Published before the flag is read, as `stopping` is, so a concurrent
        request is not lost (at worst the callback runs twice: it must allow that)."""
        self._on_stop = callback
        if self._stop_requested:
            callback()

    @property
    def stop_requested(self) -> bool:
        return self._stop_requested

    @property
    def logger(self) -> Logger:
        """Bound to job id, type and attempt; made on first use (no cost for quiet jobs)."""
        if self._logger is None:
            self._logger = logger.bind(job_id=self.job_id, job_type=self.name, attempt=self.attempt)
        return self._logger

    # -- streamed events (worker/streaming.py: the bounds and the rates) ----------------

    def progress(self, done: float, total: float | None = None, *, note: str | None = None) -> None:
        """Report how far the job got ("done of total", a short note): readers of its stream
        (app.stream, app.wait(on_progress=...), `hivejobs status --follow`, the dashboard)
        see it live, and late ones see the last report. Cheap to call often: reports within
        0.1 s of each other are coalesced, the latest wins. Bad values raise InvalidArgument.
        Without a pool (hivejobs.testing, inline mode) it only checks its arguments."""
        from hivejobs.worker.streaming import progress_event

        event = progress_event(self.job_id, self.attempt, done, total, note)
        if self._events is not None:
            self._events.progress(event)

    def emit(self, partial_result: object) -> bool:
        """Send a partial result (JSON, at most 64 KiB) to the job's live readers; not
        stored. False when this attempt's emit rate (a burst of 20, then 20 a second) was
        spent and it was dropped; the next one delivered says how many were dropped."""
        from hivejobs.worker.streaming import encoded_partial

        encoded = encoded_partial(partial_result)
        if self._events is None:
            return True
        return self._events.emit(self.job_id, self.attempt, encoded)
