"""The watch on a pool process's event loop: an `async def` handler that holds the loop (a
blocking call, a long computation) stalls every task of the process, so it is reported,
once per job type, with where it held it.

While tasks run, the loop stamps the time on itself every quarter of the threshold (a timer
of its own: no wake-up crosses threads) and a watcher thread reads the stamp as often; a
stamp older than the threshold means the loop is held by whatever runs on its thread, which
the watcher reads from the thread's stack (sys._current_frames()) and blames on the handler
whose frame is on it. A loop merely late (the process was not scheduled, a
burst of short steps) shows no handler frame there and is not reported. Never touches the
loop's tasks, and nothing the pool's liveness needs: the heartbeat has its own thread.
"""

from __future__ import annotations

import asyncio
import inspect
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from types import CodeType, FrameType

from loguru import logger

from hivejobs.worker.exits import fatal_on_error

BLOCKED_AFTER_S = 0.1  # a handler holding the loop longer than this is reported
MSG_BLOCKED = (
    "an async handler held the event loop for {held_ms} ms and more: every task of this"
    " process waited (reported once per job type)"
)


def handler_codes(handlers: Mapping[str, Callable[..., object]]) -> dict[CodeType, str]:
    """The code objects whose frames are each job type's handler (decorators unwrapped)."""
    codes: dict[CodeType, str] = {}
    for name, handler in handlers.items():
        for fn in (handler, inspect.unwrap(handler)):
            code = getattr(fn, "__code__", None)
            if isinstance(code, CodeType):
                codes[code] = name
    return codes


def blame(frame: FrameType | None, codes: Mapping[CodeType, str]) -> tuple[str, str] | None:
    """The job type whose handler is on the stack ending at `frame` (innermost first), and
    the stack from that handler's frame inward, formatted; None if no handler is on it."""
    walked: list[FrameType] = []
    while frame is not None:
        walked.append(frame)
        name = codes.get(frame.f_code)
        if name is not None:
            summary = traceback.StackSummary.extract(
                ((f, f.f_lineno) for f in reversed(walked)), capture_locals=False
            )
            return name, "".join(summary.format()).rstrip()
        frame = frame.f_back
    return None


class LoopWatch:
    """Owns the watcher thread, `reported` (the job types already reported; the watcher
    thread alone writes it), the loop's stamp (`_stamp`, a float written on the loop's
    thread, read by the watcher) and whether the loop's timer runs (`_ticking`: set by the
    watcher when it starts the timer, cleared on the loop's thread when the timer stops).
    `busy` says whether any task runs: an idle loop is not woken."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        loop_thread: threading.Thread,
        handlers: Mapping[str, Callable[..., object]],
        busy: Callable[[], bool],
        threshold_s: float = BLOCKED_AFTER_S,
    ) -> None:
        self.loop = loop
        self.loop_thread = loop_thread
        self.codes = handler_codes(handlers)
        self.busy = busy
        self.threshold_s = threshold_s
        self.reported: set[str] = set()
        self.log = logger.bind(pool=",".join(sorted(set(handlers))))
        self._gap_s = threshold_s / 4
        self._stamp = time.monotonic()
        self._ticking = False
        self._stopped = threading.Event()
        self._thread = threading.Thread(
            target=fatal_on_error(self._run), name="loop-watch", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()

    def _tick(self) -> None:
        """On the loop's thread: stamp the time, again in a quarter threshold while busy."""
        self._stamp = time.monotonic()
        if self.busy() and not self._stopped.is_set():
            self.loop.call_later(self._gap_s, self._tick)
        else:
            self._ticking = False

    def _run(self) -> None:
        # A hold of threshold + two gaps is always seen; shorter ones may be.
        while not self._stopped.wait(self._gap_s):
            if not self.busy():
                continue
            if not self._ticking:
                # The timer stopped while the loop was idle (or never ran): start it, and
                # count a hold from now.
                self._ticking = True
                self._stamp = time.monotonic()
                self.loop.call_soon_threadsafe(self._tick)
                continue
            stamp = self._stamp
            if time.monotonic() - stamp > self.threshold_s:
                self._held(stamp)

    def _held(self, stamp: float) -> None:
        """The loop has not stamped in time: look at its thread until it does."""
        while not self._stopped.is_set():
            frame = sys._current_frames().get(self.loop_thread.ident or -1)
            found = blame(frame, self.codes)
            del frame
            if found is not None and found[0] not in self.reported:
                name, stack = found
                self.reported.add(name)
                held_ms = round((time.monotonic() - stamp) * 1000)
                self.log.warning(MSG_BLOCKED, held_ms=held_ms, job_type=name, where=stack)
            if self._stopped.wait(self._gap_s) or self._stamp != stamp:
                return
