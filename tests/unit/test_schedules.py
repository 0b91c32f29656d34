"""Cron schedules without servers: which ticks are due, and what is refused at declaration."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from hivejobs import (
    App,
    InvalidArgument,
    InvalidJobType,
    JobContext,
    PayloadInvalid,
    UnknownJobType,
)
from hivejobs.records.fleet import ScheduleState
from hivejobs.schedules import due_ticks, next_tick, tick_job_id

T0 = datetime(2026, 1, 5, 12, 0, 0, tzinfo=UTC)  # a Monday, winter (Paris is UTC+1)


def state(cron: str, last: datetime | None, catch_up: bool, tz: str = "UTC") -> ScheduleState:
    return ScheduleState(
        name="s",
        job_type="t",
        cron=cron,
        tz=tz,
        payload=b"null",
        priority=0,
        catch_up=catch_up,
        declared_at=T0,
        last_tick=last,
    )


@pytest.mark.parametrize(
    ("cron", "last", "now", "catch_up", "expected"),
    [
        # Never ran: nothing before the declaration is owed.
        ("*/5 * * * *", None, T0 + timedelta(minutes=4), False, []),
        ("*/5 * * * *", None, T0 + timedelta(minutes=5), False, [T0 + timedelta(minutes=5)]),
        # Missed ticks: only the latest without catch_up, every one with it.
        ("*/5 * * * *", T0, T0 + timedelta(minutes=16), False, [T0 + timedelta(minutes=15)]),
        (
            "*/5 * * * *",
            T0,
            T0 + timedelta(minutes=16),
            True,
            [T0 + timedelta(minutes=m) for m in (5, 10, 15)],
        ),
        # The tick at exactly `now` is due; the last one enqueued is not again.
        ("* * * * * */10", T0, T0 + timedelta(seconds=10), False, [T0 + timedelta(seconds=10)]),
        ("* * * * * */10", T0 + timedelta(seconds=10), T0 + timedelta(seconds=19), True, []),
    ],
)
def test_due_ticks(
    cron: str, last: datetime | None, now: datetime, catch_up: bool, expected: list[datetime]
) -> None:
    assert due_ticks(state(cron, last, catch_up), now) == expected


def test_catch_up_is_capped_per_pass() -> None:
    ticks = due_ticks(state("* * * * * *", T0, True), T0 + timedelta(hours=1))
    assert len(ticks) == 100 and ticks[0] == T0 + timedelta(seconds=1)


S = timedelta(seconds=1)
EVERY_SECOND = "* * * * * *"


@pytest.mark.parametrize(
    ("led_since", "now", "ahead_s", "expected"),
    [
        # The leader held the lease throughout: a pass that came 2.5 s after the last tick
        # owes both ticks, with or without catch_up.
        (T0 - 60 * S, T0 + 2.5 * S, 0.0, [T0 + S, T0 + 2 * S]),
        # It took the lease at T0 + 3.5 s: of the ticks before, missed while nobody led, only
        # the latest; every tick after is owed.
        (T0 + 3.5 * S, T0 + 6 * S, 0.0, [T0 + 3 * S, T0 + 4 * S, T0 + 5 * S, T0 + 6 * S]),
        # Written ahead: the ticks of the next 3 s too.
        (T0 - 60 * S, T0 + 1.5 * S, 3.0, [T0 + k * S for k in (1, 2, 3, 4)]),
        # A leader that learnt the lease only now owes the latest missed tick, as before.
        (None, T0 + 10 * S, 0.0, [T0 + 10 * S]),
    ],
)
def test_every_tick_due_under_the_lease_is_owed_without_catch_up(
    led_since: datetime | None, now: datetime, ahead_s: float, expected: list[datetime]
) -> None:
    got = due_ticks(state(EVERY_SECOND, T0, False), now, led_since=led_since, ahead_s=ahead_s)
    assert got == expected


def test_owed_ticks_are_capped_per_pass() -> None:
    ticks = due_ticks(state(EVERY_SECOND, T0, False), T0 + 3600 * S, led_since=T0)
    assert ticks == [T0 + k * S for k in range(1, 101)]


def test_time_zone_is_honoured() -> None:
    nine_in_paris = state("0 9 * * *", T0, False, tz="Europe/Paris")
    assert next_tick(nine_in_paris, T0) == datetime(2026, 1, 6, 8, 0, tzinfo=UTC)


def test_tick_ids_are_stable() -> None:
    assert tick_job_id("report", T0) == "cron:report:2026-01-05T12:00:00Z"


def make_app() -> App:
    app = App(database_url="postgresql://unused/x", redis_url="redis://unused")

    @app.job("report")
    def report(ctx: JobContext, payload: dict[str, int]) -> None: ...

    return app


@pytest.mark.parametrize(
    ("kwargs", "error", "text"),
    [
        ({"cron": "61 * * * *"}, InvalidJobType, "not a valid cron expression"),
        ({"cron": "* * * * *", "tz": "Mars/Olympus"}, InvalidJobType, "not a known time zone"),
        ({"cron": "* * * * *", "payload": [1]}, PayloadInvalid, "Expected `object`"),
        ({"cron": "* * * * *", "name": "bad name"}, InvalidJobType, "schedule name"),
        ({"cron": "* * * * *", "priority": 12}, InvalidArgument, "priority"),
    ],
)
def test_bad_schedules_are_refused(kwargs: dict[str, object], error: type, text: str) -> None:
    app = make_app()
    with pytest.raises(error, match=text):
        app.periodic("report", **kwargs)  # type: ignore[arg-type]
    assert app.schedules == {}


def test_unknown_type_and_duplicate_names_are_refused() -> None:
    app = make_app()
    with pytest.raises(UnknownJobType):
        app.periodic("reprot", "* * * * *")
    app.periodic("report", "0 * * * *", {"n": 1})
    with pytest.raises(InvalidJobType, match="declared twice"):
        app.periodic("report", "0 * * * *")
    app.periodic("report", "30 * * * *", {"n": 2}, name="report-half-past")
    assert sorted(app.schedules) == ["report", "report-half-past"]


def test_cron_on_the_decorator_declares_a_schedule() -> None:
    app = App(database_url="postgresql://unused/x", redis_url="redis://unused")

    @app.job("cleanup", cron="0 3 * * *", tz="Europe/Paris")
    def cleanup(ctx: JobContext, payload: None) -> None: ...

    assert app.schedules["cleanup"].cron == "0 3 * * *"
    with pytest.raises(InvalidJobType):
        app.job("other", cron="nope")
