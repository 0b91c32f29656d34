"""executor.execute, the one place a handler runs (pool and hivejobs.testing): each way an
attempt can end, as a table of handler behaviour, attempt and shutdown state."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from hivejobs import App, Interrupted, JobContext, Retry
from hivejobs.jobtypes import Fail
from hivejobs.records import ClaimedJob, Delivery
from hivejobs.worker.context import JobContext as Ctx
from hivejobs.worker.executor import execute


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
    job = ClaimedJob(
        id="j1",
        name="t",
        attempt=attempt,
        attempts=jt.attempts,
        delivery=delivery,
        payload=b"null",
        claim_token=7,
        priority=0,
    )
    done = execute(jt, job, Ctx(job, app), max_result_bytes=1 << 20, shutting_down=lambda: stopping)
    assert (done.id, done.claim_token, done.outcome) == ("j1", 7, outcome)
    if outcome == "succeeded":
        assert done.result == b'{"ok":true}'
