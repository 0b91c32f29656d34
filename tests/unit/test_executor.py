"""executor.execute, the one place a handler runs (pool and hivejobs.testing): each way an
attempt can end, as a table of handler behaviour, attempt and shutdown state."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from hivejobs import App, Interrupted, JobContext, Retry
from hivejobs.client.app import JobContext as Ctx
from hivejobs.jobtypes import Backoff, Fail, JobType
from hivejobs.records.jobs import ClaimedJob, Completion, Delivery
from hivejobs.worker.executor import execute, execute_async


def raise_(exc: BaseException) -> Callable[[JobContext, object], object]:
    def handler(ctx: JobContext, payload: object) -> object:
        raise exc

    return handler


CASES: list[tuple[str, Callable[[JobContext, object], object], int, bool, Delivery, str]] = [
    ("returns", lambda ctx, p: {"ok": True}, 1, False, "at_least_once", "succeeded"),
    ("raises, attempts left", raise_(ValueError("x")), 1, False, "at_least_once", "retry"),
    ("raises, last attempt", raise_(ValueError("x")), 3, False, "at_least_once", "failed"),
    ("Retry", raise_(Retry(delay=1.0)), 1, False, "at_least_once", "retry"),
    ("Fail, attempts left", raise_(Fail("no")), 1, False, "at_least_once", "failed"),
    ("Interrupted at shutdown", raise_(Interrupted()), 1, True, "at_least_once", "suspend"),
    ("Interrupted at shutdown, amo", raise_(Interrupted()), 1, True, "at_most_once", "failed"),
    ("Interrupted, no shutdown", raise_(Interrupted()), 1, False, "at_least_once", "retry"),
]


@pytest.mark.parametrize(
    ("handler", "attempt", "stopping", "delivery", "outcome"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_execute_outcomes(
    handler: Callable[[JobContext, object], object],
    attempt: int,
    stopping: bool,
    delivery: Delivery,
    outcome: str,
) -> None:
    app = App(database_url="postgresql://127.0.0.1:1/x", redis_url="redis://127.0.0.1:1")
    app.job("t", attempts=1 if delivery == "at_most_once" else 3, delivery=delivery)(handler)
    jt = app.types["t"]
    job = _claimed(attempt, jt.attempts, delivery)
    done = execute(jt, job, Ctx(job, app), max_result_bytes=1 << 20, shutting_down=lambda: stopping)
    assert (done.id, done.claim_token, done.outcome) == ("j1", 7, outcome)
    if outcome == "succeeded":
        assert done.result == b'{"ok":true}'


def _attempt(jt: JobType, app: App, attempt: int, max_result_bytes: int = 1 << 20) -> Completion:
    job = ClaimedJob(
        id="j1",
        name=jt.name,
        attempt=attempt,
        attempts=jt.attempts,
        delivery="at_least_once",
        payload=b"null",
        claim_token=7,
        priority=0,
    )
    return execute(jt, job, Ctx(job, app), max_result_bytes=max_result_bytes)


RETRIED: list[tuple[str, Callable[[JobContext, object], object], int]] = [
    ("raises", raise_(ValueError("x")), 1 << 20),
    ("Retry without a delay", raise_(Retry()), 1 << 20),
    ("result too large", lambda ctx, p: "x" * 100, 10),
]


@pytest.mark.parametrize(
    ("handler", "max_result_bytes"), [c[1:] for c in RETRIED], ids=[c[0] for c in RETRIED]
)
def test_the_retry_delay_is_the_backoff_of_the_attempt_that_failed(
    handler: Callable[[JobContext, object], object], max_result_bytes: int
) -> None:
    """base * 2**(attempt-1) with +-20 % jitter: the bands of successive attempts do not
    overlap, so each delay says which attempt the backoff was asked about."""
    app = App(database_url="postgresql://127.0.0.1:1/x", redis_url="redis://127.0.0.1:1")
    app.job("t", attempts=9, backoff=Backoff(base_s=2.0, max_s=1000.0))(handler)
    jt = app.types["t"]
    for attempt in range(1, 9):
        done = _attempt(jt, app, attempt, max_result_bytes)
        assert done.outcome == "retry"
        nominal = 2.0 * 2 ** (attempt - 1)
        assert 0.8 * nominal <= done.retry_delay_s <= 1.2 * nominal, (attempt, done)


def _claimed(attempt: int, attempts: int, delivery: Delivery) -> ClaimedJob:
    return ClaimedJob(
        id="j1",
        name="t",
        attempt=attempt,
        attempts=attempts,
        delivery=delivery,
        payload=b"null",
        claim_token=7,
        priority=0,
    )


def _as_async(
    handler: Callable[[JobContext, object], object],
) -> Callable[[JobContext, object], Coroutine[Any, Any, object]]:
    async def awaited(ctx: JobContext, payload: object) -> object:
        await asyncio.sleep(0)
        return handler(ctx, payload)

    return awaited


@pytest.mark.parametrize(
    ("handler", "attempt", "stopping", "delivery", "outcome"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_execute_async_outcomes_are_those_of_execute(
    handler: Callable[[JobContext, object], object],
    attempt: int,
    stopping: bool,
    delivery: Delivery,
    outcome: str,
) -> None:
    app = App(database_url="postgresql://127.0.0.1:1/x", redis_url="redis://127.0.0.1:1")
    attempts = 1 if delivery == "at_most_once" else 3
    app.job("t", attempts=attempts, delivery=delivery)(_as_async(handler))
    job = _claimed(attempt, attempts, delivery)
    done = asyncio.run(
        execute_async(
            app.types["t"],
            job,
            Ctx(job, app),
            max_result_bytes=1 << 20,
            shutting_down=lambda: stopping,
        )
    )
    assert (done.id, done.claim_token, done.outcome) == ("j1", 7, outcome)
    if outcome == "succeeded":
        assert done.result == b'{"ok":true}'


# How a stop request reaches an awaiting handler: as the cancellation of its task.
STOPS: list[tuple[str, bool, bool, Delivery, str]] = [
    ("cancel", True, False, "at_least_once", "cancelled"),
    ("timeout", False, False, "at_least_once", "retry"),
    ("shutdown", False, True, "at_least_once", "suspend"),
    ("shutdown, amo", False, True, "at_most_once", "failed"),
]


@pytest.mark.parametrize(
    ("cancelled", "shutting_down", "delivery", "outcome"),
    [case[1:] for case in STOPS],
    ids=[case[0] for case in STOPS],
)
def test_a_stop_request_cancels_the_awaiting_handler(
    cancelled: bool, shutting_down: bool, delivery: Delivery, outcome: str
) -> None:
    app = App(database_url="postgresql://127.0.0.1:1/x", redis_url="redis://127.0.0.1:1")
    seen: list[str] = []

    async def waits(ctx: JobContext, payload: object) -> None:
        try:
            await asyncio.Event().wait()  # only a cancellation ends it
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    attempts = 1 if delivery == "at_most_once" else 3
    app.job("t", attempts=attempts, delivery=delivery)(waits)
    job = _claimed(1, attempts, delivery)
    ctx = Ctx(job, app)

    async def attempt() -> Completion:
        running = asyncio.ensure_future(
            execute_async(
                app.types["t"],
                job,
                ctx,
                max_result_bytes=1 << 20,
                shutting_down=lambda: shutting_down,
            )
        )
        await asyncio.sleep(0.01)
        ctx.cancelled = cancelled
        # From another thread, as the watchdog, the control thread and the shutdown do.
        await asyncio.to_thread(ctx.request_stop)
        # Not wait_for: its own cancellation at the deadline would end the handler too.
        await asyncio.wait({running}, timeout=10)
        assert running.done(), "the stop request never reached the handler"
        return running.result()

    done = asyncio.run(attempt())
    assert seen == ["cancelled"]
    assert done.outcome == outcome
    if outcome in ("retry", "cancelled"):
        assert "asked to stop" in (done.error or "")


def test_a_stop_after_the_handler_returned_does_not_cancel_its_task() -> None:
    """The pool's task goes on after the handler (a chain try's output is written): a stop
    requested as the handler returns must not cancel it there, or its Completion is lost."""
    app = App(database_url="postgresql://127.0.0.1:1/x", redis_url="redis://127.0.0.1:1")

    async def returns_as_stopped(ctx: JobContext, payload: object) -> str:
        ctx.request_stop()  # as if the watchdog asked in the handler's last step
        return "done"

    app.job("t", attempts=3)(returns_as_stopped)
    job = _claimed(1, 3, "at_least_once")

    async def pool_task() -> Completion:
        done = await execute_async(app.types["t"], job, Ctx(job, app), max_result_bytes=1 << 20)
        await asyncio.sleep(0.01)  # the task's own work after the attempt
        return done

    assert asyncio.run(pool_task()).outcome == "succeeded"


@pytest.mark.parametrize("kind", ["def", "async"])
def test_an_attempt_that_ends_on_its_timeout_fails_with_the_timeout(kind: str) -> None:
    """The watchdog's stop reaches a cooperative `def` handler as `stopping` (it raises
    Interrupted) and an `async def` one as cancellation: either way the attempt's error is the
    timeout, as a hung handler's is, not the Interrupted that ended it."""
    app = App(database_url="postgresql://127.0.0.1:1/x", redis_url="redis://127.0.0.1:1")

    def watches(ctx: JobContext, payload: object) -> None:
        ctx.stopping.wait(10)
        raise Interrupted()

    async def waits(ctx: JobContext, payload: object) -> None:
        await asyncio.Event().wait()

    app.job("t", attempts=3)(watches if kind == "def" else waits)
    jt, job = app.types["t"], _claimed(1, 3, "at_least_once")
    ctx = Ctx(job, app)
    ctx.request_stop("timed out after 2s")  # before the start: the handler sees it at once
    if kind == "def":
        done = execute(jt, job, ctx, max_result_bytes=1 << 20)
    else:
        done = asyncio.run(execute_async(jt, job, ctx, max_result_bytes=1 << 20))
    assert (done.outcome, done.error) == ("retry", "timed out after 2s")


def test_an_attempts_lines_reach_a_host_apps_debug_sink_and_skip_levels_no_sink_takes() -> None:
    """logs.enabled gates the per-job lines on loguru's minimum over every sink: a host app's
    DEBUG sink still gets "started"; with a WARNING sink only, no line is built and the
    attempt's logger is never bound."""
    from loguru import logger

    app = App(database_url="postgresql://127.0.0.1:1/x", redis_url="redis://127.0.0.1:1")
    app.job("t", attempts=3)(lambda ctx, p: None)
    jt = app.types["t"]
    lines: list[str] = []
    logger.remove()
    logger.enable("hivejobs")  # as setup_logging does in a worker
    try:
        logger.add(lines.append, level="WARNING", format="{message}")
        job = _claimed(1, 3, "at_least_once")
        quiet = Ctx(job, app)
        assert execute(jt, job, quiet, max_result_bytes=1 << 20).outcome == "succeeded"
        assert lines == [] and quiet._logger is None
        logger.add(lines.append, level="DEBUG", format="{level} {message}")
        assert execute(jt, job, Ctx(job, app), max_result_bytes=1 << 20).outcome == "succeeded"
        assert [line.split()[0] for line in lines] == ["DEBUG", "INFO"]
        assert "t[j1] started" in lines[0]
    finally:
        logger.remove()
        logger.add(sys.stderr)
        logger.disable("hivejobs")
