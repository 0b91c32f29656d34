"""app.wait and app.await_job against a real `hivejobs run`: woken by the NOTIFY
of the archiving transaction, not by reading the job in a loop."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import pytest

from hivejobs import App, InvalidArgument, JobInfo, JobNotFound, WaitTimeout
from tests.apps.gate import open_gate
from tests.harness import Instance, fleet_app, sql

APP = "tests.apps.flowapp:app"


@pytest.fixture
def app(
    start_instance: Callable[..., Instance], make_app: Callable[..., App], database_url: str
) -> App:
    start_instance({}, app_spec=APP)
    return fleet_app(make_app, database_url, ["plain", "limited"])


def counting_reads(app: App) -> list[str]:
    """Record every read of a job the App makes (the real get_job, counted)."""
    reads: list[str] = []
    real = app.get_job

    def get_job(job_id: str) -> JobInfo:
        reads.append(job_id)
        return real(job_id)

    app.get_job = get_job  # type: ignore[method-assign]
    return reads


def test_wait_returns_the_finished_job_without_polling(app: App, database_url: str) -> None:
    reads = counting_reads(app)
    job_id = app.enqueue("plain", {"ms": 1500, "echo": {"answer": 42}})
    began = time.monotonic()
    info = app.wait(job_id, timeout=30)
    assert info.state == "succeeded" and info.result == {"answer": 42}, info.error
    assert time.monotonic() - began >= 1.4
    # One read before the watch, one after it, one per wake-up: not a loop over 1.5 s.
    assert len(reads) <= 4, reads
    assert sql(database_url, "SELECT count(*) FROM hivejobs_waiter")[0][0] == 0  # cleaned up

    reads.clear()
    assert app.wait(job_id, timeout=0).state == "succeeded"  # finished: at once
    assert reads == [job_id]

    failing = app.enqueue("plain", {"ms": 1, "fail": True})
    done = app.wait(failing, timeout=30)
    assert (done.state, done.error) == ("failed", "Fail: asked to fail")


def test_wait_gives_up_after_its_timeout(app: App) -> None:
    job_id = app.enqueue("plain", {"gate": "after the timeout"})
    with pytest.raises(WaitTimeout, match=rf"job '{job_id}' is still (queued|running) after"):
        app.wait(job_id, timeout=0.3)
    open_gate(app.connections.broker, "after the timeout")
    assert app.wait(job_id, timeout=30).state == "succeeded"  # the job was not touched


def test_wait_refuses_bad_input(app: App) -> None:
    with pytest.raises(JobNotFound):
        app.wait("no-such-job", timeout=1)
    for bad in (-1, float("nan"), "5", True):
        with pytest.raises(InvalidArgument, match="timeout must be seconds >= 0 or None"):
            app.wait(app.enqueue("plain", {"ms": 1}), timeout=bad)  # type: ignore[arg-type]


def test_no_wake_up_is_lost_among_many_short_jobs(app: App) -> None:
    """Waits opened while their jobs finish (the watch's race with the archiving commit):
    every one returns, none runs into its timeout."""
    ids = app.enqueue_many("plain", [{"ms": i % 5} for i in range(60)])
    ends: dict[str, str] = {}

    def waiter(job_id: str) -> None:
        ends[job_id] = app.wait(job_id, timeout=30).state

    threads = [threading.Thread(target=waiter, args=(i,)) for i in ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert ends == {i: "succeeded" for i in ids}


def test_await_job_in_an_event_loop(app: App) -> None:
    job_id = app.enqueue("plain", {"ms": 500, "echo": "done"})

    async def main() -> tuple[JobInfo, int]:
        ticks = 0

        async def ticker() -> None:  # the loop stays free while the wait blocks
            nonlocal ticks
            while True:
                await asyncio.sleep(0.05)
                ticks += 1

        task = asyncio.create_task(ticker())
        info = await app.await_job(job_id, timeout=30)
        task.cancel()
        return info, ticks

    info, ticks = asyncio.run(main())
    assert (info.state, info.result) == ("succeeded", "done")
    assert ticks >= 5
