"""Run one claimed attempt and say how it ended: the one place a handler is called.

Pure of I/O on our side: decode the payload, call the handler, encode the result, and turn
what happened into a Completion (succeeded, retry, failed, cancelled, suspend). The pool
submits it to its completer; `hivejobs.testing` writes it at once. Never touches Postgres
or Redis itself, so both run a handler exactly the same way.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hivejobs.errors import HivejobsError, Interrupted, PayloadInvalid, ResultTooLarge
from hivejobs.records import ClaimedJob, Completion, Outcome
from hivejobs.serialization import encode_result, storable_text
from hivejobs.worker.async_handlers import call_handler
from hivejobs.worker.capture import uncaptured

if TYPE_CHECKING:
    from loguru import Logger

    from hivejobs.jobtypes import JobType
    from hivejobs.worker.context import JobContext

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


def execute(
    jt: JobType,
    job: ClaimedJob,
    ctx: JobContext,
    *,
    max_result_bytes: int,
    shutting_down: Callable[[], bool] = _never,
) -> Completion:
    """Run `job` under `jt`'s handler and return its Completion; never raises for what the
    handler does (a handler's error ends its attempt, not the caller's thread)."""
    from hivejobs.jobtypes import Fail, Retry

    log = ctx.logger
    names = {"job_type": job.name, "job_id": job.id}
    # DEBUG: at INFO, a line per job is the outcome's. A line costs the pool
    # process ~40 us of CPU (loguru's record, format and write), as much as the rest of a
    # short job's own bookkeeping.
    _say(log, "DEBUG", MSG_STARTED, **names)
    started = time.monotonic()
    try:
        if jt.handler is None:
            raise HivejobsError(f"job type {jt.name!r} has no handler in this process")
        payload = jt.codec.decode(job.payload)
        result = call_handler(jt.handler, ctx, payload)  # async def handlers too
        encoded = encode_result(result)
        if encoded is not None and len(encoded) > max_result_bytes:
            # A cut JSON document is not JSON: refuse the whole result, say why.
            raise ResultTooLarge(len(encoded), max_result_bytes)
    except PayloadInvalid as exc:
        # Schema drift will not fix itself on retry: fail for good, keep the pool alive.
        _say(log, "ERROR", "payload does not decode", error=str(exc), **names)
        return ended(job, "failed", str(exc), max_result_bytes)
    except Fail as exc:
        # The handler says another attempt cannot help: failed now, attempts left or not.
        _say(log, "ERROR", MSG_FAIL, error=str(exc), **names)
        outcome: Outcome = "cancelled" if ctx.cancelled else "failed"
        return ended(job, outcome, f"Fail: {exc}", max_result_bytes)
    except ResultTooLarge as exc:
        return failed(job, ctx, str(exc), jt.backoff.delay_s(job.attempt), max_result_bytes)
    except Retry as exc:
        delay = exc.delay if exc.delay is not None else jt.backoff.delay_s(job.attempt)
        return failed(job, ctx, f"Retry: {exc}", delay, max_result_bytes)
    except BaseException as exc:  # any handler error ends this attempt
        stopping = shutting_down()
        if stopping and (isinstance(exc, Interrupted | SystemExit) or ctx.stop_requested):
            # A stop is not an attempt, whatever exception the handler raised (R9).
            at_most_once = job.delivery == "at_most_once"
            # At-most-once and started: fail it, never run it again; else suspend (uncounted).
            _say(
                log,
                "INFO",
                MSG_INTERRUPTED,
                then="failed" if at_most_once else "suspended",
                **names,
            )
            if at_most_once:
                return ended(job, "failed", "interrupted by shutdown", max_result_bytes)
            return Completion(id=job.id, claim_token=job.claim_token, outcome="suspend")
        text = "".join(traceback.format_exception(exc))
        return failed(job, ctx, text, jt.backoff.delay_s(job.attempt), max_result_bytes, exc=exc)
    elapsed_s = round(time.monotonic() - started, 3)
    if jt.callback:
        # The other service has the work now: the job stays running until its callback.
        _say(log, "INFO", MSG_AWAITING, elapsed_s=elapsed_s, **names)
        return Completion(
            id=job.id,
            claim_token=job.claim_token,
            outcome="await_callback",
            callback_timeout_s=jt.callback_timeout_s or 3600.0,
        )
    _say(log, "INFO", MSG_SUCCEEDED, elapsed_s=elapsed_s, **names)
    return Completion(id=job.id, claim_token=job.claim_token, outcome="succeeded", result=encoded)


def failed(
    job: ClaimedJob,
    ctx: JobContext,
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
        _say(ctx.logger, "INFO", MSG_CANCELLED, **names)
        return ended(job, "cancelled", error, max_result_bytes)
    if job.attempt < job.attempts:
        _say(ctx.logger, "WARNING", MSG_RETRY, delay_s=round(delay, 1), error=last_line, **names)
        return Completion(
            id=job.id,
            claim_token=job.claim_token,
            outcome="retry",
            error=error,
            retry_delay_s=delay,
        )
    if exc is not None:  # the traceback follows the line, its last line says the error
        _say(ctx.logger, "ERROR", MSG_FAILED, exc=exc, **names)
    else:
        _say(ctx.logger, "ERROR", MSG_FAILED, error=last_line, **names)
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


def _say(log: Logger, level: str, message: str, **fields: Any) -> None:
    """hivejobs' own lines about an attempt (started, succeeded, its traceback) are not the
    attempt's output: they stay out of a chain try's captured stdout/stderr (the job log).
    `exc=` logs that exception's traceback after the line."""
    exc: BaseException | None = fields.pop("exc", None)
    with uncaptured():
        (log if exc is None else log.opt(exception=exc)).log(level, message, **fields)
