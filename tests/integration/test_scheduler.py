"""The Scheduler's pass against real Postgres and Redis: one job per tick, written with the
tick reached under the lease; a stale view or a lost lease writes nothing."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

from hivejobs import App, JobContext
from hivejobs.coordinator.scheduler import Scheduler, _tick_job
from hivejobs.records.dispatch import Lease
from hivejobs.schedules import due_ticks
from hivejobs.store import new_worker_id
from hivejobs.store.schedules import ScheduleStore
from tests.harness import sql


def declared(make_app: Callable[..., App], catch_up: bool) -> App:
    app = make_app()

    @app.job("tick")
    def tick(ctx: JobContext, payload: dict[str, int]) -> None: ...

    app.periodic("tick", "* * * * * */5", {"n": 1}, catch_up=catch_up)
    app.connections.store.upsert_job_types([app.types["tick"].info()])
    ScheduleStore(app.connections.store).declare(["tick"], list(app.schedules.values()))
    return app


def lease(app: App) -> Lease:
    holder = new_worker_id()
    term = app.connections.store.lease_acquire(holder, 30.0)
    assert term is not None
    return Lease(holder, term)


def rewind(database_url: str, seconds: int) -> None:
    """As if the schedule was declared, and last ran, `seconds` ago."""
    sql(
        database_url,
        "UPDATE hivejobs_schedule SET declared_at = now() - %(s)s * interval '1 second',"
        " last_tick = date_trunc('minute', now()) - %(s)s * interval '1 second'",
        {"s": seconds},
    )


def jobs(database_url: str) -> list[str]:
    return [r[0] for r in sql(database_url, "SELECT id FROM hivejobs_job ORDER BY id")]


def test_catch_up_enqueues_every_missed_tick_once(
    make_app: Callable[..., App], database_url: str
) -> None:
    app = declared(make_app, catch_up=True)
    rewind(database_url, 60)
    held = lease(app)
    scheduler = Scheduler(app.connections.store, app.connections.broker)
    first = scheduler.run_once(held)
    assert first >= 12  # a minute of 5-second ticks, and those since the minute began
    assert scheduler.run_once(held) <= 1  # a tick may have come due meanwhile, not more
    ids = jobs(database_url)
    assert len(ids) == len(set(ids)) and all(i.startswith("cron:tick:") for i in ids)
    pushed = app.connections.broker.redis.llen(app.connections.broker.queue_key("tick", 0))
    queued = sql(database_url, "SELECT count(*) FROM hivejobs_job WHERE state = 'queued'")
    assert pushed == queued[0][0] >= len(ids) - 1  # a tick ahead waits, scheduled


def test_without_catch_up_only_the_latest_missed_tick_runs(
    make_app: Callable[..., App], database_url: str
) -> None:
    app = declared(make_app, catch_up=False)
    rewind(database_url, 60)
    assert Scheduler(app.connections.store, app.connections.broker).run_once(lease(app)) == 1


def lease_since(database_url: str, seconds: int) -> None:
    """As if the lease's holder took it `seconds` before the schedule's last tick."""
    sql(
        database_url,
        "UPDATE hivejobs_leader SET acquired_at = (SELECT last_tick FROM hivejobs_schedule)"
        " - %(s)s * interval '1 second'",
        {"s": seconds},
    )


def five_second_ticks(ids: list[str]) -> list[int]:
    """The ticks' offsets, in 5-second steps, from the first."""
    times = sorted(datetime.strptime(i.split(":", 2)[2], "%Y-%m-%dT%H:%M:%SZ") for i in ids)
    return [int((t - times[0]).total_seconds()) // 5 for t in times]


def test_without_catch_up_every_tick_due_under_the_lease_runs(
    make_app: Callable[..., App], database_url: str
) -> None:
    """A pass that comes late (a loaded machine, a slow database) still owes every tick that
    fell due while its leader held the lease; only those missed before it are dropped."""
    app = declared(make_app, catch_up=False)
    rewind(database_url, 60)
    held = lease(app)
    lease_since(database_url, 1)
    assert (
        Scheduler(app.connections.store, app.connections.broker, ahead_s=0.0).run_once(held) >= 12
    )
    ids = jobs(database_url)
    assert five_second_ticks(ids) == list(range(len(ids)))  # no tick skipped


def test_ticks_ahead_wait_scheduled_and_a_new_leader_neither_doubles_nor_skips(
    make_app: Callable[..., App], database_url: str
) -> None:
    app = declared(make_app, catch_up=False)
    rewind(database_url, 60)
    first = lease(app)
    lease_since(database_url, 1)
    Scheduler(app.connections.store, app.connections.broker, ahead_s=12.0).run_once(first)
    waiting = sql(
        database_url,
        "SELECT id, run_at FROM hivejobs_job WHERE state = 'scheduled' ORDER BY run_at",
    )
    assert len(waiting) >= 2  # the next 12 s of 5-second ticks
    for job_id, run_at in waiting:
        assert job_id == f"cron:tick:{run_at.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}"
    # The leader dies; another takes the lease over at once and runs its passes.
    sql(database_url, "UPDATE hivejobs_leader SET expires_at = now() - interval '1 second'")
    second = lease(app)
    assert second.term == first.term + 1
    Scheduler(app.connections.store, app.connections.broker, ahead_s=12.0).run_once(second)
    ids = jobs(database_url)
    assert five_second_ticks(ids) == list(range(len(ids)))


def test_a_stale_view_and_a_lost_lease_write_nothing(
    make_app: Callable[..., App], database_url: str
) -> None:
    app = declared(make_app, catch_up=True)
    rewind(database_url, 60)
    schedules = ScheduleStore(app.connections.store)
    (state,) = schedules.states()
    now = schedules.now()
    # Another coordinator of the same moment advanced the schedule first.
    sql(database_url, "UPDATE hivejobs_schedule SET last_tick = now()")
    (jt,) = app.connections.store.job_types()
    ticks = due_ticks(state, now)
    job_list = [_tick_job(state, t, jt, now) for t in ticks]
    assert schedules.enqueue_ticks_if_leader(lease(app), state, job_list, ticks[-1]) == []
    # A holder whose term ended writes nothing either.
    (fresh,) = schedules.states()
    stale = Lease(new_worker_id(), 1)
    assert schedules.enqueue_ticks_if_leader(stale, fresh, job_list, ticks[-1]) is None
    assert jobs(database_url) == []


def test_redeclaring_with_another_expression_restarts_from_now(
    make_app: Callable[..., App], database_url: str
) -> None:
    app = declared(make_app, catch_up=True)
    rewind(database_url, 3600)
    app.schedules.clear()
    app.periodic("tick", "0 * * * *", {"n": 1}, catch_up=True)
    ScheduleStore(app.connections.store).declare(["tick"], list(app.schedules.values()))
    (state,) = ScheduleStore(app.connections.store).states()
    assert state.last_tick is None and state.cron == "0 * * * *"
    assert Scheduler(app.connections.store, app.connections.broker).run_once(lease(app)) == 0
    ScheduleStore(app.connections.store).declare(["tick"], [])  # removed from the code: it stops
    assert ScheduleStore(app.connections.store).states() == []
