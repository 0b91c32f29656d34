"""A running job's voice: `ctx.progress(done, total, note=...)` and `ctx.emit(partial_result)`
go from the handler to Redis pub/sub (live readers) and the last progress to Postgres
(late readers), off the handler's path and at a bounded rate.

The bounds, per attempt (docs/howto/progress.md says the same to users):
- progress is coalesced: published at most every PROGRESS_EVERY_S (the latest report of
  an interval wins; nothing is queued), stored at most every STORE_EVERY_S, and once more
  when the attempt ends, before its completion is submitted;
- emits pass a token bucket (EMIT_BURST at once, EMIT_PER_S after): one beyond it is
  dropped, `ctx.emit` returns False, and the next delivered emit says how many were
  dropped (`dropped`). Dropped, not refused: a job that emits too fast should not fail.
  A report held back by coalescing goes out just ahead of the emit that follows it, so an
  attempt's events keep the order it made them in (at most one report more per emit);
- a note is at most MAX_NOTE_CHARS characters, a partial result at most MAX_EMIT_BYTES of
  JSON: beyond, InvalidArgument names the field, and nothing is sent.

The handler's call validates and records under a lock (no I/O: safe on an event loop);
the sink's thread publishes and stores. Never blocks a handler on Redis or Postgres, and
never fails a job because Redis or Postgres is down: events are then lost (a warning says
so), the job's outcome is not.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import msgspec
import psycopg
import redis
from loguru import logger

from hivejobs.broker import Broker
from hivejobs.errors import InvalidArgument
from hivejobs.logs import error_fields
from hivejobs.records.events import JobEvent
from hivejobs.store import Store
from hivejobs.store.progress import save_progress

PROGRESS_EVERY_S = 0.1  # a job's progress reaches Redis at most ten times a second
STORE_EVERY_S = 1.0  # and Postgres at most once a second (and when the attempt ends)
EMIT_BURST = 20  # emits let through at once ...
EMIT_PER_S = 20.0  # ... and per second after that, per attempt
MAX_NOTE_CHARS = 500
MAX_EMIT_BYTES = 64 * 1024
FINISH_WAIT_S = 5.0  # an ending attempt waits this long at most for its last events
WARN_EVERY_S = 10.0  # a lost event's warning, at most this often

_encoder = msgspec.json.Encoder()


def progress_event(
    job_id: str, attempt: int, done: float, total: float | None, note: str | None
) -> JobEvent:
    """The event of one `ctx.progress` call, or InvalidArgument naming the bad field."""
    checked_done = _count("done", done)
    checked_total = None if total is None else _count("total", total)
    if checked_total is not None and checked_done > checked_total:
        raise InvalidArgument(f"ctx.progress: done ({done}) must not exceed total ({total})")
    if note is not None:
        if not isinstance(note, str):
            raise InvalidArgument(f"ctx.progress: note must be a str, not {type(note).__name__}")
        if len(note) > MAX_NOTE_CHARS:
            raise InvalidArgument(
                f"ctx.progress: note is {len(note)} characters, more than the "
                f"{MAX_NOTE_CHARS} allowed"
            )
        if "\x00" in note:
            raise InvalidArgument("ctx.progress: note must not contain NUL characters (\\u0000)")
    return JobEvent(
        kind="progress",
        job_id=job_id,
        attempt=attempt,
        done=checked_done,
        total=checked_total,
        note=note,
    )


def _count(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgument(f"ctx.progress: {name} must be a number, not {value!r}")
    if not math.isfinite(value) or value < 0:
        raise InvalidArgument(f"ctx.progress: {name} must be a finite number >= 0, not {value!r}")
    return float(value)


def encoded_partial(partial_result: object) -> bytes:
    """A partial result as JSON, or InvalidArgument naming `partial_result`."""
    try:
        encoded = _encoder.encode(partial_result)
    except (TypeError, msgspec.EncodeError) as exc:
        raise InvalidArgument(f"ctx.emit: partial_result is not JSON-encodable: {exc}") from None
    if len(encoded) > MAX_EMIT_BYTES:
        raise InvalidArgument(
            f"ctx.emit: partial_result is {len(encoded)} bytes as JSON, more than the "
            f"{MAX_EMIT_BYTES} allowed: send a summary, keep the whole in the job's result"
        )
    return encoded


@dataclass
class _Attempt:
    """What the sink keeps of one running attempt's events (guarded by EventSink.cond)."""

    attempt: int
    refilled_at: float
    tokens: float = float(EMIT_BURST)
    dropped: int = 0
    latest: JobEvent | None = None  # progress not published yet
    published_at: float = -math.inf  # the first report goes out at once
    unstored: JobEvent | None = None  # progress published but not stored yet
    # The first store waits STORE_EVERY_S from the attempt's first report: a short job
    # writes one row, when it ends, not one at its start and another at its end.
    stored_at: float = 0.0
    ending: threading.Event | None = None  # set by the thread once all is sent (finish)


class EventSink:
    """Publishes and stores the events of one lane's attempts from a thread of its own.

    Owns `_attempts` (job id -> _Attempt) and `_outbox` (encoded emits in order), both
    guarded by `cond`, and `_warned_at`/`_lost`, the thread's alone; the thread, started
    on first use (a pool process makes its sinks after the fork), is the only one doing
    I/O. Keeps, per attempt: at most one progress per PROGRESS_EVERY_S reaches Redis and
    one per STORE_EVERY_S Postgres, the latest of each interval, and an ended attempt's
    last report is sent before finish() returns."""

    def __init__(
        self,
        store: Store,
        broker: Broker,
        clock: Callable[[], float] = time.monotonic,
        sending: bool = True,
    ) -> None:
        self.store = store
        self.broker = broker
        # A test's own clock and no thread (sending=False) leave the decisions (_due) to
        # be checked without timing anything.
        self.clock = clock
        self.sending = sending
        self.cond = threading.Condition()
        self._attempts: dict[str, _Attempt] = {}
        self._outbox: list[tuple[str, bytes]] = []
        self._thread: threading.Thread | None = None
        self._warned_at = -math.inf
        self._lost = 0
        self.log = logger.bind(role="events")

    # -- the handler's side (any thread, the event loop's included: no I/O) -------------

    def progress(self, event: JobEvent) -> None:
        with self.cond:
            entry = self._entry(event.job_id, event.attempt)
            entry.latest = event
            if self.clock() - entry.published_at >= PROGRESS_EVERY_S:
                self.cond.notify()

    def emit(self, job_id: str, attempt: int, encoded: bytes) -> bool:
        """Queue one partial result; False when the attempt's rate is spent (dropped)."""
        now = self.clock()
        with self.cond:
            entry = self._entry(job_id, attempt)
            entry.tokens = min(
                float(EMIT_BURST), entry.tokens + (now - entry.refilled_at) * EMIT_PER_S
            )
            entry.refilled_at = now
            if entry.tokens < 1.0:
                entry.dropped += 1
                return False
            entry.tokens -= 1.0
            if entry.latest is not None:
                # A report held back by coalescing goes out ahead of the emit that follows
                # it: an attempt's events arrive in the order it made them.
                self._outbox.append((job_id, _encoder.encode(entry.latest)))
                entry.unstored, entry.latest = entry.latest, None
                entry.published_at = now
            event = JobEvent(
                kind="emit",
                job_id=job_id,
                attempt=attempt,
                data=msgspec.Raw(encoded),
                dropped=entry.dropped,
            )
            entry.dropped = 0
            self._outbox.append((job_id, _encoder.encode(event)))
            self.cond.notify()
        return True

    def reported(self, job_id: str) -> bool:
        """Whether this attempt sent anything (finish then has work to wait for)."""
        with self.cond:
            return job_id in self._attempts

    def finish(self, job_id: str) -> None:
        """The attempt ended: send its pending progress (to Redis and Postgres) and emits,
        and return once they are sent (at most FINISH_WAIT_S), before the attempt's
        completion is submitted, so a reader woken by the job's end finds the last progress
        stored. Blocks: an `async def` handler's task calls it in a thread."""
        with self.cond:
            entry = self._attempts.get(job_id)
            if entry is None:
                return
            done = entry.ending = threading.Event()
            self.cond.notify()
        if not done.wait(FINISH_WAIT_S):
            self.log.warning("last events of an attempt not sent in time", job_id=job_id)
        with self.cond:
            self._attempts.pop(job_id, None)

    def _entry(self, job_id: str, attempt: int) -> _Attempt:
        entry = self._attempts.get(job_id)
        if entry is None or entry.attempt != attempt:
            now = self.clock()
            entry = self._attempts[job_id] = _Attempt(attempt, refilled_at=now, stored_at=now)
            if self.sending and (self._thread is None or not self._thread.is_alive()):
                self._thread = threading.Thread(target=self._run, name="events", daemon=True)
                self._thread.start()
        return entry

    # -- the sink's thread ------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self.cond:
                publish, store, ended, wait_s = self._due(self.clock())
                if not (publish or store or ended):
                    self.cond.wait(wait_s)
                    continue
            self._send(publish, store)
            for done in ended:
                done.set()

    def _due(
        self, now: float
    ) -> tuple[list[tuple[str, bytes]], list[JobEvent], list[threading.Event], float | None]:
        """What to send now (under `cond`), and how long to sleep when nothing is due."""
        publish, self._outbox = self._outbox, []
        store: list[JobEvent] = []
        ended: list[threading.Event] = []
        next_due = math.inf
        for entry in self._attempts.values():
            ending = entry.ending is not None and not entry.ending.is_set()
            if entry.latest is not None:
                if ending or now - entry.published_at >= PROGRESS_EVERY_S:
                    publish.append((entry.latest.job_id, _encoder.encode(entry.latest)))
                    entry.unstored, entry.latest = entry.latest, None
                    entry.published_at = now
                else:
                    next_due = min(next_due, entry.published_at + PROGRESS_EVERY_S)
            if entry.unstored is not None:
                if ending or now - entry.stored_at >= STORE_EVERY_S:
                    store.append(entry.unstored)
                    entry.unstored = None
                    entry.stored_at = now
                else:
                    next_due = min(next_due, entry.stored_at + STORE_EVERY_S)
            if ending and entry.ending is not None:
                ended.append(entry.ending)
        wait_s = None if next_due == math.inf else max(0.0, next_due - now)
        return publish, store, ended, wait_s

    def _send(self, publish: list[tuple[str, bytes]], store: list[JobEvent]) -> None:
        if publish:
            try:
                self.broker.publish_events(publish)
            except redis.RedisError as exc:
                # Live readers miss these; the last progress still reaches Postgres below.
                self._warn("job events not published", len(publish), exc)
        if store:
            try:
                save_progress(self.store, store)
            except psycopg.Error as exc:
                self._warn("job progress not stored", len(store), exc)

    def _warn(self, message: str, count: int, exc: Exception) -> None:
        """One line per WARN_EVERY_S while a server is down, not one per batch (this thread's
        own state: `_lost` counts what the lines not written would have said)."""
        self._lost += count
        now = time.monotonic()
        if now - self._warned_at >= WARN_EVERY_S:
            self.log.warning(message, events=self._lost, **error_fields(exc))
            self._lost, self._warned_at = 0, now
