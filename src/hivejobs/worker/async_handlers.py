"""`async def` handlers: the one event loop of a process, and a thread's way onto it.

A pool runs an async type's attempts as tasks on this loop (worker/tasks.py); a caller in a
thread (hivejobs.testing, or a pool's suspect that must run alone) hands the coroutine over
with run_task() and blocks until its task has ended. Either way a stop request (shutdown,
cancel, timeout: whatever calls `ctx.request_stop`) reaches the task as asyncio
cancellation through `ctx.on_stop`, with nobody polling: the handler sees CancelledError,
the executor sees `Interrupted` and treats it as it treats a thread handler's (suspended at
shutdown, cancelled on cancel, a failed attempt on timeout). Owns the loop and its thread;
never runs a sync handler.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import os
import threading
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from hivejobs.errors import Interrupted

if TYPE_CHECKING:
    from hivejobs.worker.context import AttemptContext

_lock = threading.Lock()
# (pid that made it, loop, its thread)
_loop: tuple[int, asyncio.AbstractEventLoop, threading.Thread] | None = None


def is_async(handler: Callable[..., object] | None) -> bool:
    return handler is not None and inspect.iscoroutinefunction(handler)


def new_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop where it is installed (`hivejobs[uvloop]`), else asyncio's. Its loop
    turn and socket I/O are C: a handler awaiting the network (a Redis or HTTP client) costs
    the pool process less CPU per job, and the loop's own turns less time under the GIL
    that the pool's threads share. HIVEJOBS_UVLOOP=0 keeps asyncio's loop."""
    if os.environ.get("HIVEJOBS_UVLOOP", "1") != "0":
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def process_loop() -> tuple[asyncio.AbstractEventLoop, threading.Thread]:
    """The loop of this process and the thread that runs it, started on first use. Made
    again after a fork: a forked child has the parent's loop object but not its thread."""
    global _loop
    with _lock:
        if _loop is None or _loop[0] != os.getpid():
            loop = new_loop()
            thread = threading.Thread(target=loop.run_forever, name="event-loop", daemon=True)
            thread.start()
            _loop = (os.getpid(), loop, thread)
        return _loop[1], _loop[2]


def call_handler(handler: Callable[..., object], ctx: AttemptContext, payload: object) -> object:
    """The handler's return value; for `async def` (what it returned is a coroutine),
    awaited on the process's loop. Told apart by what the call returned, an isinstance
    check, not by inspecting the handler (~1.5 us a job on a `def` runner's path)."""
    returned = handler(ctx, payload)
    if not inspect.iscoroutine(returned):
        return returned
    return run_task(returned, ctx)


def run_task(coroutine: Coroutine[Any, Any, object], ctx: AttemptContext) -> object:
    """Run `coroutine` as a task on the process's loop and block this thread until it has
    ended (its `finally` blocks ran); a stop request cancels it. Called on that loop's own
    thread (an async handler that runs a job in place: hivejobs.testing's inline enqueue),
    it runs on a loop of its own in a helper thread: the caller holds the process's loop,
    where the task would never start."""
    loop, thread = process_loop()

    async def awaited() -> object:
        task = asyncio.current_task()
        running = asyncio.get_running_loop()
        if task is not None:
            # From a later turn of the loop: never within the task's own step.
            ctx.on_stop(lambda: running.call_soon_threadsafe(task.cancel))
        return await coroutine

    future: concurrent.futures.Future[object]
    if threading.current_thread() is thread:
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="nested") as helper:
            future = helper.submit(asyncio.run, awaited())
    else:
        future = asyncio.run_coroutine_threadsafe(awaited(), loop)
    try:
        return future.result()
    except (concurrent.futures.CancelledError, asyncio.CancelledError):
        raise Interrupted("asked to stop: its task was cancelled") from None
