"""`async def` handlers: run as tasks on one event loop per pool process.

The pool's runner threads stay as they are (each holds one claim): a runner hands an async
handler's coroutine to the process's loop and waits for its task, so at most `concurrency`
tasks run at once, interleaved on one thread while they await. A stop request (shutdown,
cancel, timeout: whatever sets `ctx.stopping`) reaches the task as asyncio cancellation,
and the runner waits until the task has really ended (its `finally` blocks ran) before the
attempt ends: the handler sees CancelledError, the executor sees `Interrupted`, and treats
it as it treats a thread handler's Interrupted (suspended at shutdown, cancelled on cancel,
a failed attempt on timeout). Owns the loop and its thread; never runs a sync handler.
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
    from hivejobs.worker.context import JobContext

STOP_POLL_S = 0.05  # how often a runner waiting on a task looks at ctx.stopping

_lock = threading.Lock()
_loop: tuple[int, asyncio.AbstractEventLoop] | None = None  # (pid that made it, loop)


def is_async(handler: Callable[..., object]) -> bool:
    return inspect.iscoroutinefunction(handler)


def _process_loop() -> asyncio.AbstractEventLoop:
    """The loop of this process, started on first use. Made again after a fork: a forked
    child has the parent's loop object but not its thread."""
    global _loop
    with _lock:
        if _loop is None or _loop[0] != os.getpid():
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="async-handlers", daemon=True)
            thread.start()
            _loop = (os.getpid(), loop)
        return _loop[1]


def call_handler(handler: Callable[..., object], ctx: JobContext, payload: object) -> object:
    """The handler's return value; for `async def`, awaited on the process's loop."""
    if not is_async(handler):
        return handler(ctx, payload)
    coroutine: Coroutine[Any, Any, object] = handler(ctx, payload)  # type: ignore[assignment]
    return run_task(coroutine, ctx)


def run_task(coroutine: Coroutine[Any, Any, object], ctx: JobContext) -> object:
    loop = _process_loop()
    tasks: list[asyncio.Task[object]] = []
    ready = threading.Event()

    async def started() -> object:
        task = asyncio.current_task()
        assert task is not None  # noqa: S101 - always inside a task here
        tasks.append(task)
        ready.set()
        return await coroutine

    future = asyncio.run_coroutine_threadsafe(started(), loop)
    stopping = ctx.stopping
    while not future.done():
        if stopping.wait(STOP_POLL_S):
            ready.wait()
            loop.call_soon_threadsafe(tasks[0].cancel)
            break
    try:
        return future.result()  # after a cancel: once the task has unwound
    except concurrent.futures.CancelledError:
        raise Interrupted("asked to stop: its task was cancelled") from None
