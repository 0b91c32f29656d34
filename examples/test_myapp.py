"""Unit tests of examples/myapp.py's jobs with hivejobs.testing: `pytest examples/test_myapp.py`.

The hivejobs pytest plugin (installed with hivejobs) gives each test that asks for
`hivejobs_isolate` a migrated database and a Redis prefix of its own, dropped afterwards.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from examples.myapp import app
from hivejobs import App, PayloadInvalid
from hivejobs.testing import drain, inline, run_job


def test_resize_returns_the_new_size() -> None:
    # No servers: the payload makes the JSON round trip of a real enqueue.
    run = run_job(app, "resize", {"url": "https://example.com/cat.png", "width": 64})
    assert run.outcome == "succeeded"
    assert run.result == {"url": "https://example.com/cat.png", "width": 64, "attempt": 1}


def test_a_payload_the_worker_cannot_decode_is_refused() -> None:
    with pytest.raises(PayloadInvalid, match=r"\$\.width"):
        run_job(app, "resize", {"url": "https://example.com/cat.png", "width": "wide"})


def test_flaky_asks_for_a_retry_on_its_first_attempt() -> None:
    run = run_job(app, "flaky", {})
    assert run.outcome == "retry"
    assert run.retry_delay_s == 0.5


def test_enqueue_runs_the_job_at_once_inline(hivejobs_isolate: Callable[[App], App]) -> None:
    hivejobs_isolate(app)
    with inline(app):
        job_id = app.enqueue("resize", {"url": "https://example.com/dog.png", "width": 32})
    job = app.get_job(job_id)
    assert job.state == "succeeded"
    assert job.result == {"url": "https://example.com/dog.png", "width": 32, "attempt": 1}


def test_drain_runs_every_attempt_of_a_flaky_job(hivejobs_isolate: Callable[[App], App]) -> None:
    hivejobs_isolate(app)
    job_id = app.enqueue("flaky", {})
    result = drain(app, promote="retries")  # do not wait out the retry's delay
    assert (result.retried, result.succeeded) == (1, 1)
    assert app.get_job(job_id).result == "ok on attempt 2"
