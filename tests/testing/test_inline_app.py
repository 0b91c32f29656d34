"""App(testing="inline"): enqueue runs the job in the caller with no Postgres or Redis (the
servers below are unreachable ports: a connection attempt would fail the test), with `def` and
`async def` handlers alike."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from hivejobs import App, JobContext, PayloadInvalid, Retry
from hivejobs.client import inline
from hivejobs.errors import ConfigError, DrainIncomplete, JobIdConflict, JobNotFound
from tests.harness import HANDLER_KINDS, of_kind

NOWHERE = {"database_url": "postgresql://127.0.0.1:1/x", "redis_url": "redis://127.0.0.1:1"}
KINDS = pytest.mark.parametrize("kind", HANDLER_KINDS)


class Resize(msgspec.Struct):
    url: str
    width: int


def inline_app(kind: str = "def") -> tuple[App, list[str]]:
    """The app of these tests, with handlers of `kind` ("def" or "async")."""
    app = App(**NOWHERE, testing="inline")
    seen: list[str] = []
    handler = of_kind(kind)

    @app.job("resize")
    @handler
    def resize(ctx: JobContext, payload: Resize) -> dict[str, object]:
        seen.append(f"resize {payload.width}")
        return {"url": payload.url, "width": payload.width * 2}

    @app.job("flaky", attempts=3)
    @handler
    def flaky(ctx: JobContext, payload: dict[str, int]) -> int:
        seen.append(f"flaky attempt {ctx.attempt}")
        if ctx.attempt < payload["ok_at"]:
            raise Retry(delay=600, reason="not yet")  # not waited for here
        return ctx.attempt

    @app.job("boom", attempts=2)
    @handler
    def boom(ctx: JobContext, payload: None) -> None:
        raise ValueError("boom")

    @app.job("fan_out")
    @handler
    def fan_out(ctx: JobContext, payload: int) -> None:
        for n in range(payload):
            ctx.app.enqueue("resize", Resize(url=f"/{n}", width=n))
        seen.append("fan_out returned")

    @app.job("forever")
    @handler
    def forever(ctx: JobContext, payload: None) -> None:
        ctx.app.enqueue("forever")

    return app, seen


@KINDS
def test_enqueue_runs_the_job_at_once_with_its_payload_round_trip(kind: str) -> None:
    app, seen = inline_app(kind)
    job_id = app.enqueue("resize", {"url": "/a.png", "width": 100})
    info = app.get_job(job_id)
    assert (info.state, info.attempt) == ("succeeded", 1)
    assert info.result == {"url": "/a.png", "width": 200}
    assert info.payload == {"url": "/a.png", "width": 100}
    assert seen == ["resize 100"]


@KINDS
def test_bad_input_raises_as_enqueue_does_and_keeps_nothing(kind: str) -> None:
    app, seen = inline_app(kind)
    with pytest.raises(PayloadInvalid, match=r"Expected `int`, got `str` - at `\$.width`"):
        app.enqueue("resize", {"url": "/a.png", "width": "wide"}, id="bad-1")
    with pytest.raises(JobNotFound):
        app.get_job("bad-1")
    assert seen == []


@KINDS
def test_retries_run_at_once_and_a_final_failure_keeps_its_traceback(kind: str) -> None:
    app, seen = inline_app(kind)
    ok = app.get_job(app.enqueue("flaky", {"ok_at": 2}))
    assert (ok.state, ok.attempt, ok.result) == ("succeeded", 2, 2)
    failed = app.get_job(app.enqueue("boom"))
    assert (failed.state, failed.attempt) == ("failed", 2)
    assert failed.error is not None and "ValueError: boom" in failed.error
    assert seen == ["flaky attempt 1", "flaky attempt 2"]


@KINDS
def test_jobs_a_handler_enqueues_run_after_it_returns(kind: str) -> None:
    app, seen = inline_app(kind)
    app.enqueue("fan_out", 2)
    assert seen == ["fan_out returned", "resize 0", "resize 1"]


def test_an_id_is_idempotent_and_another_payload_under_it_conflicts() -> None:
    app, seen = inline_app()
    first = app.enqueue("resize", {"url": "/a", "width": 1}, id="order-42")
    assert app.enqueue("resize", {"width": 1, "url": "/a"}, id="order-42") == first
    with pytest.raises(JobIdConflict):
        app.enqueue("resize", {"url": "/b", "width": 1}, id="order-42")
    assert seen == ["resize 1"]  # ran once


@KINDS
def test_enqueue_many_and_the_async_forms(kind: str) -> None:
    app, seen = inline_app(kind)
    ids = app.enqueue_many("resize", [{"url": "/a", "width": 1}, {"url": "/b", "width": 2}])
    assert [app.get_job(i).state for i in ids] == ["succeeded", "succeeded"]

    async def main() -> str:
        job_id = await app.aenqueue("resize", Resize(url="/c", width=3))
        return (await app.aget_job(job_id)).state

    assert asyncio.run(main()) == "succeeded"
    assert seen == ["resize 1", "resize 2", "resize 3"]


@KINDS
def test_a_job_that_enqueues_itself_forever_stops(
    monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    monkeypatch.setattr(inline, "MAX_JOBS", 50)
    app, _ = inline_app(kind)
    with pytest.raises(DrainIncomplete):
        app.enqueue("forever")


def test_an_unknown_mode_is_refused() -> None:
    with pytest.raises(ConfigError, match="testing must be one of"):
        App(**NOWHERE, testing="eager")  # type: ignore[arg-type]
