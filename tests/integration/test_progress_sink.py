"""The pool's event sink against real Postgres and Redis: an ending attempt's last report is
published and stored before finish() returns, and a Redis that does not answer costs the
live events only, never the handler's call nor the stored progress."""

from __future__ import annotations

from collections.abc import Callable

from hivejobs import App, JobContext, JobEvent
from hivejobs.client.app import JobContext as Context
from hivejobs.records.jobs import ClaimedJob
from hivejobs.worker.streaming import EventSink
from tests.harness import free_port


def context(app: App, sink: EventSink, job_id: str) -> JobContext:
    job = ClaimedJob(
        id=job_id,
        name="t",
        attempt=2,
        attempts=3,
        priority=0,
        delivery="at_least_once",
        payload=b"null",
        claim_token=1,
    )
    return Context(job, app, events=sink)


def test_finish_returns_once_the_last_report_is_published_and_stored(
    make_app: Callable[..., App],
) -> None:
    app = make_app()
    sink = EventSink(app.connections.store, app.connections.broker)
    subscription = app.connections.broker.subscribe_events("sink-1")
    ctx = context(app, sink, "sink-1")
    for i in range(50):
        ctx.progress(i + 1, 50, note=f"row {i + 1}")
    assert ctx.emit({"rows": 50})
    sink.finish("sink-1")
    stored = app.progress("sink-1")
    assert stored is not None
    assert (stored.attempt, stored.done, stored.total, stored.note) == (2, 50.0, 50.0, "row 50")
    live: list[JobEvent] = []  # all of it published by now: read up to the last report
    while not ({"emit"} <= {e.kind for e in live} and 50.0 in {e.done for e in live}):
        event = subscription.get(10.0)
        assert event is not None, live
        live.append(event)
    subscription.close()
    # Coalesced (tests/unit/test_progress_bounds.py says how many: this depends on time), in
    # order, ending on the last report; and the emit.
    assert [e.data for e in live if e.kind == "emit"] == [{"rows": 50}]
    dones = [e.done or 0.0 for e in live if e.kind == "progress"]
    assert dones[-1] == 50.0 and dones == sorted(dones)
    assert not sink.reported("sink-1")  # forgotten once finished


def test_a_dead_redis_loses_live_events_only(make_app: Callable[..., App]) -> None:
    app = make_app()
    dead = make_app(redis_url=f"redis://127.0.0.1:{free_port()}/0")
    sink = EventSink(app.connections.store, dead.connections.broker)
    ctx = context(app, sink, "sink-2")
    ctx.progress(3, 4, note="still here")
    assert ctx.emit({"partial": True})  # accepted; its publish fails in the sink's thread
    sink.finish("sink-2")
    stored = app.progress("sink-2")
    assert stored is not None and (stored.done, stored.note) == (3.0, "still here")
