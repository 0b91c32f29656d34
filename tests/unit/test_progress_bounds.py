"""ctx.progress / ctx.emit without servers: each bound refused with the field's name, and
the sink's decisions (coalescing, the emit bucket, the store rate) on a clock of the test's
own, so nothing here is timed."""

from __future__ import annotations

import threading
from typing import Any, cast

import msgspec
import pytest

from hivejobs import App, InvalidArgument, JobContext
from hivejobs.records.events import JobEvent
from hivejobs.records.jobs import ClaimedJob
from hivejobs.worker.streaming import (
    EMIT_BURST,
    EMIT_PER_S,
    MAX_EMIT_BYTES,
    MAX_NOTE_CHARS,
    PROGRESS_EVERY_S,
    STORE_EVERY_S,
    EventSink,
    encoded_partial,
    progress_event,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def sink(clock: Clock) -> EventSink:
    # No thread and no I/O: the store and broker are never reached.
    return EventSink(cast(Any, None), cast(Any, None), clock=clock, sending=False)


def context(events: EventSink | None) -> JobContext:
    job = ClaimedJob(
        id="j1",
        name="t",
        attempt=1,
        attempts=3,
        priority=0,
        delivery="at_least_once",
        payload=b"null",
        claim_token=7,
    )
    return JobContext(job, cast(App, None), events=events)


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ((-1, 10, None), "done"),
        ((float("nan"), 10, None), "done"),
        (("3", 10, None), "done"),
        ((True, 10, None), "done"),
        ((1, float("inf"), None), "total"),
        ((1, -2, None), "total"),
        ((11, 10, None), "must not exceed total"),
        ((1, 10, "x" * (MAX_NOTE_CHARS + 1)), "note"),
        ((1, 10, "a\x00b"), "note"),
        ((1, 10, 42), "note"),
    ],
)
def test_progress_refuses_bad_values_naming_the_field(args: tuple[Any, ...], field: str) -> None:
    events = sink(Clock())
    with pytest.raises(InvalidArgument, match=field):
        context(events).progress(args[0], args[1], note=args[2])
    assert not events.reported("j1")  # nothing recorded, so nothing will be sent


def test_progress_takes_what_is_in_bounds() -> None:
    event = progress_event("j1", 2, 3, 10, "x" * MAX_NOTE_CHARS)
    assert (event.done, event.total, event.attempt) == (3.0, 10.0, 2)
    assert progress_event("j1", 1, 5, None, None).total is None  # total unknown


def test_emit_refuses_oversize_or_unencodable_results_naming_partial_result() -> None:
    events = sink(Clock())
    ctx = context(events)
    with pytest.raises(
        InvalidArgument, match=f"partial_result is .* more than the {MAX_EMIT_BYTES}"
    ):
        ctx.emit({"blob": "x" * MAX_EMIT_BYTES})
    with pytest.raises(InvalidArgument, match="partial_result is not JSON-encodable"):
        ctx.emit({"when": object()})
    assert not events.reported("j1")
    assert len(encoded_partial("x" * (MAX_EMIT_BYTES - 2))) == MAX_EMIT_BYTES  # at the bound


def test_without_a_pool_the_calls_only_check_their_arguments() -> None:
    ctx = context(None)
    ctx.progress(1, 2, note="fine")
    assert ctx.emit({"ok": True}) is True
    with pytest.raises(InvalidArgument, match="note"):
        ctx.progress(1, 2, note="x" * (MAX_NOTE_CHARS + 1))


def test_progress_within_an_interval_is_coalesced_the_latest_wins() -> None:
    clock = Clock()
    events = sink(clock)
    ctx = context(events)
    for i in range(100):
        ctx.progress(i + 1, 100)
    publish, store, ended, _ = events._due(clock())
    assert [msgspec.json.decode(m, type=JobEvent).done for _, m in publish] == [100.0]
    assert store == [] and ended == []  # stored a second after the first report at most
    clock.now += PROGRESS_EVERY_S / 2
    ctx.progress(101, 200)
    ctx.progress(102, 200)
    publish, store, _, wait_s = events._due(clock())
    assert publish == [] and store == []  # not due yet: held, not queued
    assert wait_s == pytest.approx(PROGRESS_EVERY_S / 2)
    clock.now += PROGRESS_EVERY_S * 0.6
    publish, store, _, wait_s = events._due(clock())
    assert [msgspec.json.decode(m, type=JobEvent).done for _, m in publish] == [102.0]
    assert store == []  # Postgres gets it at most once per STORE_EVERY_S
    assert wait_s == pytest.approx(STORE_EVERY_S - PROGRESS_EVERY_S * 1.1)
    clock.now += STORE_EVERY_S
    _, store, _, _ = events._due(clock())
    assert [e.done for e in store] == [102.0]
    ctx.progress(103, 200)
    clock.now += PROGRESS_EVERY_S
    publish, store, _, wait_s = events._due(clock())
    assert len(publish) == 1 and store == []  # a second after the last store, not before
    assert wait_s == pytest.approx(STORE_EVERY_S - PROGRESS_EVERY_S)


def test_an_ending_attempt_sends_its_pending_progress_at_once() -> None:
    clock = Clock()
    events = sink(clock)
    ctx = context(events)
    ctx.progress(1, 3)
    events._due(clock())
    ctx.progress(3, 3)  # within the interval: held
    entry = events._attempts["j1"]
    entry.ending = threading.Event()
    publish, store, ended, _ = events._due(clock())
    assert [msgspec.json.decode(m, type=JobEvent).done for _, m in publish] == [3.0]
    assert [e.done for e in store] == [3.0]
    assert ended == [entry.ending]


def test_emits_beyond_the_bucket_are_dropped_and_counted_in_the_next_delivered() -> None:
    clock = Clock()
    events = sink(clock)
    ctx = context(events)
    accepted = [ctx.emit({"i": i}) for i in range(EMIT_BURST + 5)]
    assert accepted == [True] * EMIT_BURST + [False] * 5
    clock.now += 1.5 / EMIT_PER_S  # one token and a half back
    assert ctx.emit({"i": "next"}) is True
    assert ctx.emit({"i": "again"}) is False
    publish, _, _, _ = events._due(clock())
    sent = [msgspec.json.decode(m, type=JobEvent) for _, m in publish]
    assert [e.data for e in sent][-1] == {"i": "next"}
    assert [e.dropped for e in sent] == [0] * EMIT_BURST + [5]


def test_a_held_report_goes_out_ahead_of_the_emit_that_follows_it() -> None:
    clock = Clock()
    events = sink(clock)
    ctx = context(events)
    ctx.progress(1, 3)
    events._due(clock())  # published at once
    ctx.progress(2, 3)  # within the interval: held ...
    ctx.emit({"after": 2})  # ... until an emit follows it
    publish, _, _, _ = events._due(clock())
    sent = [msgspec.json.decode(m, type=JobEvent) for _, m in publish]
    assert [(e.kind, e.done) for e in sent] == [("progress", 2.0), ("emit", None)]
