"""hivejobs.testing: run_job without servers, inline enqueue, drain against the real database
(the executor the pool uses), with `def` and `async def` handlers alike, and the pytest plugin
running examples/test_myapp.py."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable

import pytest

from hivejobs import App, JobContext, PayloadInvalid, Retry
from hivejobs.errors import DrainIncomplete
from hivejobs.testing import drain, inline, run_job
from tests.harness import HANDLER_KINDS, REDIS_URL, ROOT, of_kind, sql

KINDS = pytest.mark.parametrize("kind", HANDLER_KINDS)


def flaky_app(app: App, kind: str = "def") -> App:
    """The types of these tests, with handlers of `kind` ("def" or "async")."""
    handler = of_kind(kind)

    @app.job("boom", attempts=3)
    @handler
    def boom(ctx: JobContext, payload: dict[str, int]) -> None:
        raise ValueError(f"boom {payload['n']}")

    @app.job("later")
    @handler
    def later(ctx: JobContext, payload: None) -> None:
        raise Retry(delay=2.5, reason="not yet")

    @app.job("double")
    @handler
    def double(ctx: JobContext, payload: int) -> int:
        return payload * 2

    @app.job("fan_out")
    @handler
    def fan_out(ctx: JobContext, payload: int) -> None:
        for n in range(payload):
            ctx.app.enqueue("double", n)

    @app.job("forever")
    @handler
    def forever(ctx: JobContext, payload: None) -> None:
        ctx.app.enqueue("forever")

    return app


@KINDS
def test_run_job_needs_no_servers_and_returns_the_pools_outcome(kind: str) -> None:
    # Unreachable servers: run_job must never connect.
    nowhere = App(database_url="postgresql://127.0.0.1:1/x", redis_url="redis://127.0.0.1:1")
    app = flaky_app(nowhere, kind)
    assert run_job(app, "double", 21).result == 42
    first = run_job(app, "boom", {"n": 1})
    assert first.outcome == "retry" and first.retry_delay_s > 0
    last = run_job(app, "boom", {"n": 2}, attempt=3)
    assert last.outcome == "failed"
    assert (
        last.error is not None and "Traceback" in last.error and "ValueError: boom 2" in last.error
    )
    assert run_job(app, "later").retry_delay_s == 2.5
    with pytest.raises(PayloadInvalid):
        run_job(app, "double", "two")


@KINDS
def test_inline_enqueue_runs_the_job_and_what_it_enqueues(
    make_app: Callable[..., App], kind: str
) -> None:
    app = flaky_app(make_app(), kind)
    with inline(app):
        parent = app.enqueue("fan_out", 3)
        delayed = app.enqueue("double", 5, delay=60)
        failing = app.enqueue("boom", {"n": 3})
    assert app.get_job(parent).state == "succeeded"
    results = sql(
        app.settings.database_url, "SELECT result FROM hivejobs_archive WHERE name = 'double'"
    )
    assert sorted(r[0] for r in results) == [b"0", b"2", b"4"]
    assert app.get_job(delayed).state == "scheduled"  # a delay is kept, as in production
    assert (app.get_job(failing).state, app.get_job(failing).attempt) == ("scheduled", 1)
    outside = app.enqueue("double", 1)  # the block is over: only stored
    assert app.get_job(outside).state == "queued"
    assert sql(app.settings.database_url, "SELECT count(*) FROM hivejobs_worker") == [(0,)]


@KINDS
def test_drain_runs_queued_jobs_and_promotes_only_what_it_is_told(
    make_app: Callable[..., App], kind: str
) -> None:
    app = flaky_app(make_app(), kind)
    fan = app.enqueue("fan_out", 2)
    boom = app.enqueue("boom", {"n": 4})
    delayed = app.enqueue("double", 7, delay=600)
    first = drain(app)
    assert (first.succeeded, first.retried, first.failed) == (3, 1, 0)  # fan_out + 2 doubles
    assert app.get_job(fan).state == "succeeded"
    assert app.get_job(boom).state == "scheduled"
    retries = drain(app, promote="retries")
    assert (retries.retried, retries.failed) == (1, 1)
    failed = app.get_job(boom)
    assert failed.state == "failed" and failed.attempt == 3
    assert failed.error is not None and "ValueError: boom 4" in failed.error
    assert app.get_job(delayed).state == "scheduled"
    assert drain(app, promote="all").succeeded == 1
    assert app.get_job(delayed).result == 14
    with pytest.raises(DrainIncomplete):
        app.enqueue("forever")
        drain(app, max_jobs=5)
    assert sql(app.settings.database_url, "SELECT count(*) FROM hivejobs_worker") == [(0,)]


def test_drain_leaves_a_paused_types_jobs_queued(make_app: Callable[..., App]) -> None:
    app = flaky_app(make_app())
    app.connections.store.upsert_job_types([jt.info() for jt in app.types.values()])
    assert app.pause("double") is True
    held = app.enqueue("double", 4)
    ran = drain(app, types=["double", "fan_out"])  # returns: no hot loop on a paused type
    assert (ran.succeeded, app.get_job(held).state) == (0, "queued")
    assert app.resume("double") is True
    assert drain(app).succeeded == 1
    assert app.get_job(held).result == 8


def test_the_plugin_runs_the_example_tests(admin_url: str) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
        "HIVEJOBS_TEST_DATABASE_URL": admin_url,
        "HIVEJOBS_TEST_REDIS_URL": REDIS_URL,
    }
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "hivejobs.testing.plugin",
            "-p",
            "no:cacheprovider",
            "examples/test_myapp.py",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "5 passed" in proc.stdout
