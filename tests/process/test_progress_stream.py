"""Progress and partial results of jobs run by a real `hivejobs run`, read from other
processes (`hivejobs status --follow`) and from this one (app.stream, app.astream,
app.wait(on_progress=...)).

The jobs wait at a gate before each step (tests/apps/progressapp.py); the test opens the
next gate only once a reader has seen the previous step's report, so every report below
was delivered live while the job ran, never read back after it ended.
"""

from __future__ import annotations

import asyncio
import json
import queue
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from hivejobs import App, JobEvent
from tests.apps.gate import open_gate
from tests.harness import ROOT, Instance, fleet_app, sql, wait_until
from tests.process.cli import cli_env

APP = "tests.apps.progressapp:app"


@pytest.fixture
def app(
    start_instance: Callable[..., Instance], make_app: Callable[..., App], database_url: str
) -> App:
    start_instance({}, app_spec=APP)
    return fleet_app(make_app, database_url, ["steps", "asteps", "bounds", "chatty"])


class Follower:
    """`hivejobs status ID --follow --json` in a process of its own; its lines, decoded."""

    def __init__(self, app: App, job_id: str) -> None:
        env = cli_env(
            HIVEJOBS_DATABASE_URL=app.settings.database_url,
            HIVEJOBS_REDIS_URL=app.settings.redis_url,
            HIVEJOBS_PREFIX=app.settings.prefix,
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "hivejobs", "status", job_id, "--follow", "--json"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)

    def next(self) -> dict[str, Any]:
        try:
            line = self.lines.get(timeout=30)
        except queue.Empty:
            self.proc.kill()
            raise AssertionError("no line from the follower: " + self.proc.stderr.read()) from None  # type: ignore[union-attr]
        event: dict[str, Any] = json.loads(line)
        return event

    def until(self, kind: str, **fields: object) -> list[dict[str, Any]]:
        """Events up to and including the first of `kind` with `fields`."""
        seen = []
        while True:
            event = self.next()
            seen.append(event)
            if event["kind"] == kind and all(event.get(k) == v for k, v in fields.items()):
                return seen

    def close(self) -> int:
        code = self.proc.wait(30)
        assert self.proc.stderr is not None
        self.proc.stderr.close()
        return code


def subscribers(app: App, job_id: str) -> int:
    channel = app.connections.broker.events_channel(job_id)
    return int(dict(app.connections.broker.redis.pubsub_numsub(channel))[channel.encode()])


def test_progress_is_followed_live_from_other_processes_a_late_one_included(app: App) -> None:
    job_id = app.enqueue("steps", {"n": 3, "gate": "g"})
    wait_until(lambda: app.get_job(job_id).state == "running", what="the job running")
    first = Follower(app, job_id)
    wait_until(lambda: subscribers(app, job_id) == 1, what="the follower subscribed")
    open_gate(app.connections.broker, "g:0")
    seen = first.until("emit")
    assert [(e["kind"], e.get("done"), e.get("note")) for e in seen][0] == (
        "progress",
        1.0,
        "step 1",
    )
    assert seen[-1]["data"] == {"step": 1}
    open_gate(app.connections.broker, "g:1")
    first.until("progress", done=2.0)
    # Stored at most a second after it was sent: a reader that comes now starts from it.
    wait_until(lambda: (p := app.progress(job_id)) is not None and p.done == 2.0, what="stored")
    late = Follower(app, job_id)
    assert late.next() == {
        "kind": "progress", "job_id": job_id, "attempt": 1, "done": 2.0, "total": 3.0,
        "note": "step 2",
    }  # fmt: skip
    wait_until(lambda: subscribers(app, job_id) == 2, what="the late follower subscribed")
    open_gate(app.connections.broker, "g:2")
    for follower in (first, late):
        tail = follower.until("end")
        assert tail[-1]["state"] == "succeeded"
        progress = [e["done"] for e in tail if e["kind"] == "progress"]
        assert progress[-1] == 3.0 and progress == sorted(progress)
        assert follower.close() == 0
    # After the end: the last progress, then the end, at once.
    after = list(app.stream(job_id, timeout=10))
    assert [(e.kind, e.done, e.state) for e in after] == [
        ("progress", 3.0, None),
        ("end", None, "succeeded"),
    ]


def _driven(app: App, job_id: str, gate: str, seen: list[JobEvent]) -> Callable[[JobEvent], None]:
    """Opens gate `gate:0` once the stream is subscribed, then the next gate each time a
    step's progress arrives: the job advances only as fast as the reader reads."""

    def first() -> None:
        wait_until(lambda: subscribers(app, job_id) >= 1, what="the stream subscribed")
        open_gate(app.connections.broker, f"{gate}:0")

    threading.Thread(target=first, daemon=True).start()

    def on_event(event: JobEvent) -> None:
        seen.append(event)
        if event.kind == "progress" and event.done is not None:
            open_gate(app.connections.broker, f"{gate}:{int(event.done)}")

    return on_event


def test_stream_and_wait_follow_a_def_handler(app: App) -> None:
    job_id = app.enqueue("steps", {"n": 4, "gate": "s"})
    seen: list[JobEvent] = []
    on_event = _driven(app, job_id, "s", seen)
    stream: Iterator[JobEvent] = app.stream(job_id, timeout=60)
    for event in stream:
        if event.kind == "end":
            assert event.state == "succeeded"
            break
        on_event(event)
    assert [e.done for e in seen if e.kind == "progress"] == [1.0, 2.0, 3.0, 4.0]
    assert [e.data for e in seen if e.kind == "emit"] == [{"step": i} for i in (1, 2, 3, 4)]

    waited: list[JobEvent] = []
    job_id = app.enqueue("steps", {"n": 3, "gate": "w"})
    info = app.wait(job_id, timeout=60, on_progress=_driven(app, job_id, "w", waited))
    assert info.state == "succeeded" and info.result == {"steps": 3}
    assert [e.done for e in waited if e.kind == "progress"] == [1.0, 2.0, 3.0]
    assert sql(app.settings.database_url, "SELECT count(*) FROM hivejobs_waiter")[0][0] == 0


def test_astream_and_await_job_follow_an_async_handler(app: App) -> None:
    async def main() -> tuple[list[JobEvent], list[JobEvent]]:
        streamed: list[JobEvent] = []
        job_id = await app.aenqueue("asteps", {"n": 3, "gate": "a"})
        on_event = _driven(app, job_id, "a", streamed)
        async for event in app.astream(job_id, timeout=60):
            if event.kind == "end":
                assert event.state == "succeeded"
            else:
                on_event(event)
        awaited: list[JobEvent] = []
        job_id = await app.aenqueue("asteps", {"n": 2, "gate": "b"})
        sync_cb = _driven(app, job_id, "b", awaited)

        async def on_progress(event: JobEvent) -> None:  # a coroutine function is awaited
            sync_cb(event)

        info = await app.await_job(job_id, timeout=60, on_progress=on_progress)
        assert info.state == "succeeded"
        await app.aclose()
        return streamed, awaited

    streamed, awaited = asyncio.run(main())
    assert [e.done for e in streamed if e.kind == "progress"] == [1.0, 2.0, 3.0]
    assert [e.data for e in streamed if e.kind == "emit"] == [{"step": i} for i in (1, 2, 3)]
    assert [e.done for e in awaited if e.kind == "progress"] == [1.0, 2.0]


BROKEN = {
    "note": "note is 501 characters, more than the 500 allowed",
    "partial_result": "partial_result is 70011 bytes as JSON, more than the 65536 allowed",
    "done": "done (3) must not exceed total (2)",
    "nan": "done must be a finite number >= 0",
}


def test_bounds_fail_the_job_naming_the_field_and_rates_hold_a_chatty_one(app: App) -> None:
    broken = {field: app.enqueue("bounds", {"field": field}) for field in BROKEN}
    chatty = app.enqueue("chatty", {"n": 2000})
    for field, job_id in broken.items():
        info = app.wait(job_id, timeout=60)
        assert info.state == "failed"
        assert info.error is not None and BROKEN[field] in info.error, info.error
        assert app.progress(job_id) is None  # nothing of it was sent or stored
    info = app.wait(chatty, timeout=60)
    assert info.state == "succeeded", info.error
    accepted = info.result["accepted"]  # type: ignore[index]
    assert 20 <= accepted < 2000  # the burst, plus what refilled while it ran
    # 2000 reports, coalesced: the last one is stored when the attempt ends.
    last = app.progress(chatty)
    assert last is not None and (last.done, last.total) == (2000.0, 2000.0)
