"""The Scheduler's pass against real Postgres and Redis: one job per tick, written with the
tick reached under the lease; a stale view or a lost lease writes nothing."""

from __future__ import annotations

from collections.abc import Callable

from hivejobs import App, JobContext
from hivejobs.coordinator.scheduler import Scheduler, _tick_job
from hivejobs.records import Lease
from hivejobs.schedules import due_ticks
from hivejobs.store import new_worker_id
from hivejobs.store.schedules import ScheduleStore
from tests.harness import sql


def declared(make_app: Callable[..., App], catch_up: bool) -> App:
    app = make_app()

    @app.job("tick")
    def tick(ctx: JobContext, payload: dict[str, int]) -> None: ...

    app.periodic("tick", "* * * * * */5", {"n": 1}, catch_up=catch_up)
    app.store.upsert_job_types([app.types["tick"].info()])
    ScheduleStore(app.store).declare(["tick"], list(app.schedules.values()))
    return app


def lease(app: App) -> Lease:
    holder = new_worker_id()
    term = app.store.lease_acquire(holder, 30.0)
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
    scheduler = Scheduler(app.store, app.broker)
    first = scheduler.run_once(held)
    assert first >= 12  # a minute of 5-second ticks, and those since the minute began
    assert scheduler.run_once(held) <= 1  # a tick may have come due meanwhile, not more
    ids = jobs(database_url)
    assert len(ids) == len(set(ids)) and all(i.startswith("cron:tick:") for i in ids)
    pushed = app.broker.redis.llen(app.broker.queue_key("tick", 0))
    assert pushed == len(ids)


def test_without_catch_up_only_the_latest_missed_tick_runs(
    make_app: Callable[..., App], database_url: str
) -> None:
    app = declared(make_app, catch_up=False)
    rewind(database_url, 60)
    assert Scheduler(app.store, app.broker).run_once(lease(app)) == 1


def test_a_stale_view_and_a_lost_lease_write_nothing(
    make_app: Callable[..., App], database_url: str
) -> None:
    app = declared(make_app, catch_up=True)
    rewind(database_url, 60)
    schedules = ScheduleStore(app.store)
    (state,) = schedules.states()
    now = schedules.now()
    # Another coordinator of the same moment advanced the schedule first.
    sql(database_url, "UPDATE hivejobs_schedule SET last_tick = now()")
    (jt,) = app.store.job_types()
    ticks = due_ticks(state, now)
    job_list = [_tick_job(state, t, jt) for t in ticks]
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
    ScheduleStore(app.store).declare(["tick"], list(app.schedules.values()))
    (state,) = ScheduleStore(app.store).states()
    assert state.last_tick is None and state.cron == "0 * * * *"
    assert Scheduler(app.store, app.broker).run_once(lease(app)) == 0
    ScheduleStore(app.store).declare(["tick"], [])  # removed from the code: it stops
    assert ScheduleStore(app.store).states() == []
