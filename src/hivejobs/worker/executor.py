"""Run one claimed attempt and say how it ended: the one place a handler is called.

Pure of I/O on our side: decode the payload, call the handler, encode the result, and turn
what happened into a Completion (succeeded, retry, failed, cancelled, suspend). The pool
submits it to its completer; `hivejobs.testing` writes it at once. Never touches Postgres
or Redis itself, so both run a handler exactly the same way.
"""

from __future__ import annotations

import asyncio
import os
import re
import sysconfig
import time
import traceback
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, cast

from hivejobs import tracing
from hivejobs.errors import Interrupted, PayloadInvalid, ResultTooLarge
from hivejobs.logs import enabled
from hivejobs.records.jobs import ClaimedJob, Completion, Outcome
from hivejobs.serialization import encode_result, storable_text
from hivejobs.worker.async_handlers import call_handler
from hivejobs.worker.capture import uncaptured

if TYPE_CHECKING:
    from hivejobs.jobtypes import JobType
    from hivejobs.worker.context import AttemptContext

MSG_STARTED = "{job_type}[{job_id}] started"
MSG_SUCCEEDED = "{job_type}[{job_id}] succeeded in {elapsed_s:.3f} s"
MSG_RETRY = "{job_type}[{job_id}] failed, retry in {delay_s:.1f} s"
MSG_FAILED = "{job_type}[{job_id}] failed, no attempts left"
MSG_FAIL = "{job_type}[{job_id}] failed by its handler (Fail), not retried"
MSG_AWAITING = "{job_type}[{job_id}] handed over in {elapsed_s:.3f} s: awaiting its callback"
MSG_CANCELLED = "{job_type}[{job_id}] cancelled"
MSG_INTERRUPTED = "{job_type}[{job_id}] interrupted by shutdown"


def _never() -> bool:
    return False


# The plumbing above a handler: this package's frames (hivejobs/worker/.. -> hivejobs/) and
# the standard library's between them (an async handler's result crosses concurrent.futures),
# but not installed packages, which may live under the standard library's directory.
_OURS = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_STDLIB = sysconfig.get_paths()["stdlib"] + os.sep
_INSTALLED = tuple({sysconfig.get_paths()[k] + os.sep for k in ("purelib", "platlib")})
_TRIMMED = "<hivejobs>"


def _plumbing(filename: str) -> bool:
    if filename.startswith(_OURS):
        return True
    return filename.startswith(_STDLIB) and not filename.startswith(_INSTALLED)


def handler_traceback(exc: BaseException) -> str:
    """The traceback a handler's author reads: it starts at the handler's frame. The frames
    above it (the executor, the async bridge) say nothing about the failure and came first,
    so they are trimmed to one line; frames of ours the handler called into stay."""
    te = traceback.TracebackException.from_exception(exc)
    seen: set[int] = set()
    pending = [te]
    while pending:
        t = pending.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        frames = list(t.stack)
        lead = 0
        while lead < len(frames) - 1 and _plumbing(frames[lead].filename):
            lead += 1
        if 0 < lead < len(frames):
            t.stack = traceback.StackSummary.from_list(frames[lead:])
            t.stack.insert(0, traceback.FrameSummary(_TRIMMED, lead, "", lookup_line=False))
        pending += [c for c in (t.__cause__, t.__context__) if c is not None]
    note = re.compile(rf'  File "{re.escape(_TRIMMED)}", line (\d+), in \n')
    return note.sub(r"  [\1 frames of the worker calling the handler]\n", "".join(te.format()))


def execute(
    jt: JobType,
    job: ClaimedJob,
    ctx: AttemptContext,
    *,
    max_result_bytes: int,
    shutting_down: Callable[[], bool] = _never,
) -> Completion:
    """Run `job` under `jt`'s handler and return its Completion; never raises for what the
    handler does (a handler's error ends its attempt, not the caller's thread). An `async
    def` handler is awaited on the process's loop (call_handler): a thread waits for it.
    The attempt runs in its span (tracing.py) when an OpenTelemetry SDK is configured."""
    with tracing.attempting(job) as attempt:
        return attempt.ended(_execute(jt, job, ctx, max_result_bytes, shutting_down))


def _execute(
    jt: JobType,
    job: ClaimedJob,
    ctx: AttemptContext,
    max_result_bytes: int,
    shutting_down: Callable[[], bool],
) -> Completion:
    started = _began(job, ctx)
    try:
        result = call_handler(jt.handler, ctx, jt.codec.decode(job.payload))
        encoded = _encoded(result, max_result_bytes)
    except BaseException as exc:  # any handler error ends this attempt
        return _raised(jt, job, ctx, exc, max_result_bytes, shutting_down)
    return _returned(jt, job, ctx, encoded, started)


async def execute_async(
    jt: JobType,
    job: ClaimedJob,
    ctx: AttemptContext,
    *,
    max_result_bytes: int,
    shutting_down: Callable[[], bool] = _never,
) -> Completion:
    """execute() for an `async def` handler, awaited in the caller's task: a stop request
    (ctx.request_stop: shutdown, cancel, timeout) reaches the handler as the cancellation
    of that task, and ends the attempt as a thread handler's Interrupted does. The caller's
    task must not be cancelled for any other reason: the CancelledError is taken as the
    stop's and not raised on."""
    with tracing.attempting(job) as attempt:
        return attempt.ended(await _execute_async(jt, job, ctx, max_result_bytes, shutting_down))


async def _execute_async(
    jt: JobType,
    job: ClaimedJob,
    ctx: AttemptContext,
    max_result_bytes: int,
    shutting_down: Callable[[], bool],
) -> Completion:
    started = _began(job, ctx)
    canceller: _Canceller | None = None
    try:
        # An `async def` handler (the pool runs only those as tasks): a coroutine.
        coroutine = cast(Coroutine[Any, Any, object], jt.handler(ctx, jt.codec.decode(job.payload)))
        task = asyncio.current_task()
        if task is not None:
            canceller = _Canceller(task)
            ctx.on_stop(canceller)
        try:
            result = await coroutine
        finally:
            if canceller is not None:
                canceller.armed = False
        encoded = _encoded(result, max_result_bytes)
    except asyncio.CancelledError:
        # What the handler saw as cancellation is, to the attempt, the stop that caused it.
        stop = Interrupted("asked to stop: its task was cancelled")
        return _raised(jt, job, ctx, stop, max_result_bytes, shutting_down)
    except BaseException as exc:  # any handler error ends this attempt
        return _raised(jt, job, ctx, exc, max_result_bytes, shutting_down)
    return _returned(jt, job, ctx, encoded, started)


class _Canceller:
    """Cancels a task from any thread, always in a later turn of its loop, and only while
    its handler runs (`armed`, read and cleared on the loop's thread only): cancelled
    within its own step, or after its handler returned, a task would end cancelled and
    lose its Completion."""

    def __init__(self, task: asyncio.Task[Any]) -> None:
        self.task = task
        self.armed = True

    def __call__(self) -> None:
        self.task.get_loop().call_soon_threadsafe(self._fire)

    def _fire(self) -> None:
        if self.armed:
            self.task.cancel()


def _began(job: ClaimedJob, ctx: AttemptContext) -> float:
    # DEBUG: at INFO, a line per job is the outcome's. A line costs the pool process ~40 us
    # of CPU (loguru's record, format and write), as much as the rest of a short job's own
    # bookkeeping.
    _say(ctx, "DEBUG", MSG_STARTED, job_type=job.name, job_id=job.id)
    return time.monotonic()


def _encoded(result: object, max_result_bytes: int) -> bytes | None:
    encoded = encode_result(result)
    if encoded is not None and len(encoded) > max_result_bytes:
        # A cut JSON document is not JSON: refuse the whole result, say why.
        raise ResultTooLarge(len(encoded), max_result_bytes)
    return encoded


def _raised(
    jt: JobType,
    job: ClaimedJob,
    ctx: AttemptContext,
    exc: BaseException,
    max_result_bytes: int,
    shutting_down: Callable[[], bool],
) -> Completion:
    """The Completion of an attempt whose handler (or its payload, or its result) raised."""
    from hivejobs.jobtypes import Fail, Retry

    tracing.record_error(exc)
    names = {"job_type": job.name, "job_id": job.id}
    if isinstance(exc, PayloadInvalid):
        # Schema drift will not fix itself on retry: fail for good, keep the pool alive.
        _say(ctx, "ERROR", "payload does not decode", error=str(exc), **names)
        return ended(job, "failed", str(exc), max_result_bytes)
    if isinstance(exc, Fail):
        # The handler says another attempt cannot help: failed now, attempts left or not.
        _say(ctx, "ERROR", MSG_FAIL, error=str(exc), **names)
        outcome: Outcome = "cancelled" if ctx.cancelled else "failed"
        return ended(job, outcome, f"Fail: {exc}", max_result_bytes)
    if isinstance(exc, ResultTooLarge):
        return failed(job, ctx, str(exc), jt.backoff.delay_s(job.attempt), max_result_bytes)
    if isinstance(exc, Retry):
        delay = exc.delay if exc.delay is not None else jt.backoff.delay_s(job.attempt)
        return failed(job, ctx, f"Retry: {exc}", delay, max_result_bytes)
    stopping = shutting_down()
    if stopping and (isinstance(exc, Interrupted | SystemExit) or ctx.stop_requested):
        # A stop is not an attempt, whatever exception the handler raised (R9).
        at_most_once = job.delivery == "at_most_once"
        # At-most-once and started: fail it, never run it again; else suspend (uncounted).
        _say(ctx, "INFO", MSG_INTERRUPTED, then="failed" if at_most_once else "suspended", **names)
        if at_most_once:
            return ended(job, "failed", "interrupted by shutdown", max_result_bytes)
        return Completion(id=job.id, claim_token=job.claim_token, outcome="suspend")
    if ctx.stop_reason is not None and isinstance(exc, Interrupted):
        # The handler ended on the watchdog's stop (a cancelled task, a def handler that
        # watched `stopping`): the attempt failed for that reason, as a hung one does.
        return failed(job, ctx, ctx.stop_reason, jt.backoff.delay_s(job.attempt), max_result_bytes)
    text = handler_traceback(exc)
    return failed(job, ctx, text, jt.backoff.delay_s(job.attempt), max_result_bytes, exc=exc)


def _returned(
    jt: JobType, job: ClaimedJob, ctx: AttemptContext, encoded: bytes | None, started: float
) -> Completion:
    """The Completion of an attempt whose handler returned."""
    names = {"job_type": job.name, "job_id": job.id}
    elapsed_s = round(time.monotonic() - started, 3)
    if jt.callback:
        # The other service has the work now: the job stays running until its callback.
        _say(ctx, "INFO", MSG_AWAITING, elapsed_s=elapsed_s, **names)
        return Completion(
            id=job.id,
            claim_token=job.claim_token,
            outcome="await_callback",
            callback_timeout_s=jt.callback_timeout_s or 3600.0,
        )
    _say(ctx, "INFO", MSG_SUCCEEDED, elapsed_s=elapsed_s, **names)
    return Completion(id=job.id, claim_token=job.claim_token, outcome="succeeded", result=encoded)


def failed(
    job: ClaimedJob,
    ctx: AttemptContext,
    error: str,
    delay: float,
    max_result_bytes: int,
    exc: BaseException | None = None,
) -> Completion:
    """A failed attempt: retried after `delay` while attempts are left, else failed for good
    (with the traceback in the log); cancelled if a cancel was asked for meanwhile."""
    error = storable_text(error, max_result_bytes)
    names = {"job_type": job.name, "job_id": job.id}
    last_line = error.strip().splitlines()[-1][:500] if error.strip() else ""
    if ctx.cancelled:
        _say(ctx, "INFO", MSG_CANCELLED, **names)
        return ended(job, "cancelled", error, max_result_bytes)
    if job.attempt < job.attempts:
        _say(ctx, "WARNING", MSG_RETRY, delay_s=round(delay, 1), error=last_line, **names)
        return Completion(
            id=job.id,
            claim_token=job.claim_token,
            outcome="retry",
            error=error,
            retry_delay_s=delay,
        )
    if exc is not None:  # the traceback follows the line, its last line says the error
        _say(ctx, "ERROR", MSG_FAILED, exc=exc, **names)
    else:
        _say(ctx, "ERROR", MSG_FAILED, error=last_line, **names)
    return ended(job, "failed", error, max_result_bytes)


def interrupted(job: ClaimedJob, *, started: bool, max_result_bytes: int) -> Completion:
    """A claim that a stop takes back (shutdown, a suspect's quarantine, a timeout's
    neighbours): suspended, back to the queue with the attempt uncounted (R9: a graceful stop
    is not an attempt), unless an at-most-once job may have started."""
    if started and job.delivery == "at_most_once":
        # At-most-once and maybe started: fail it, never requeue.
        return ended(job, "failed", "interrupted by shutdown", max_result_bytes)
    return Completion(id=job.id, claim_token=job.claim_token, outcome="suspend")


def ended(job: ClaimedJob, outcome: Outcome, error: str, max_result_bytes: int) -> Completion:
    error = storable_text(error, max_result_bytes)
    return Completion(id=job.id, claim_token=job.claim_token, outcome=outcome, error=error)


def _say(ctx: AttemptContext, level: str, message: str, **fields: Any) -> None:
    """hivejobs' own lines about an attempt (started, succeeded, its traceback) are not the
    attempt's output: they stay out of a chain try's captured stdout/stderr (the job log).
    `exc=` logs that exception's traceback after the line. A level no sink takes costs
    nothing, not even the attempt's bound logger (logs.enabled)."""
    if not enabled(level):
        return
    log = ctx.logger
    exc: BaseException | None = fields.pop("exc", None)
    with uncaptured():
        (log if exc is None else log.opt(exception=exc)).log(level, message, **fields)
