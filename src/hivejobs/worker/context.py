"""JobContext: what a handler knows about the attempt it runs, and how it is told to stop.

Reaches its chain through the ChainStore it is handed (the pool process's own connection
pool), never through the App's: a pool process opens no second pool for its handlers.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from loguru import logger

from hivejobs.records import ClaimedJob

if TYPE_CHECKING:
    from loguru import Logger

    from hivejobs.chains.context import ChainInfo, ChainView
    from hivejobs.client.app import App
    from hivejobs.client.batches import Batch
    from hivejobs.store.chains import ChainStore
    from hivejobs.worker.streaming import EventSink


class JobContext:
    """Handed to every handler call: the attempt's identity, its stop flag, its chain.

    `stopping` is set when the worker shuts down, the job is cancelled, or its timeout passed:
    a long handler should check it and raise `hivejobs.Interrupted` (or return) promptly.
    Owns the stop flag (set from any pool thread: `request_stop` records the request before
    the event exists, `stopping` sets the event after publishing it, so no request is lost)
    and the chain view, loaded on first use. `app` is there for handlers that enqueue more
    work; the chain view uses `chains`, the store of the process running the handler.
    """

    def __init__(
        self,
        job: ClaimedJob,
        app: App,
        chains: ChainStore | None = None,
        events: EventSink | None = None,
    ) -> None:
        self.job_id = job.id
        self.name = job.name
        self.attempt = job.attempt
        self.attempts = job.attempts
        self.priority = job.priority
        self.delivery = job.delivery
        self.app = app
        self._stopping: threading.Event | None = None  # made on first use: most jobs never ask
        self._stop_requested = False
        # Why the stop was asked when it is the attempt's failure (the watchdog's timeout):
        # the error of an attempt that ends on that stop, whatever the handler raised to end.
        self.stop_reason: str | None = None
        self._on_stop: Callable[[], object] | None = None
        self.cancelled = False
        self._logger: Logger | None = None
        self._chains = chains
        self._chain: ChainView | None = None
        self._batch: tuple[Batch | None] | None = None  # looked up on first use
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

    # -- chains: loaded on first use, so plain jobs never pay for them ------------------

    @property
    def chain(self) -> ChainInfo | None:
        """The chain this job runs in (request id, args, key, try number); None if none."""
        return self._chain_view().info

    @property
    def upstream(self) -> dict[str, object]:
        """The results of this chain job's predecessors, by key ({} for a plain job)."""
        return self._chain_view().upstream()

    def set_status(self, text: str) -> None:
        """A live status line for `hivejobs chain status` ("copied 40%"); plain jobs: no-op."""
        self._chain_view().set_status(text)

    @property
    def batch(self) -> Batch | None:
        """The batch this job belongs to (None if none), as a handle that may add jobs to it
        while this job runs, even once the batch is sealed: `ctx.batch.enqueue(...)`."""
        if self._batch is None:
            self._batch = (self.app.job_batch(self.job_id),)
        return self._batch[0]

    def _chain_view(self) -> ChainView:
        if self._chain is None:
            from hivejobs.chains.context import ChainView
            from hivejobs.store.chains import ChainStore

            # Without a store of its own (hivejobs.testing runs handlers in the caller's
            # process), the App's: it is the only one there.
            chains = (
                self._chains if self._chains is not None else ChainStore(self.app.connections.store)
            )
            self._chain = ChainView(chains, self.job_id, self.app.job_type)
        return self._chain

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
