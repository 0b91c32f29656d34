"""One pass of each coordinator service against real Redis and Postgres."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psycopg
import pytest
from loguru import logger

from hivejobs import App
from hivejobs.coordinator.compactor import Compactor
from hivejobs.coordinator.elector import Elector
from hivejobs.coordinator.gauges import Gauges
from hivejobs.coordinator.reconciler import MSG_KEY_ACCEPTED, MSG_KEY_REFUSED, Reconciler
from hivejobs.coordinator.rescuer import Rescuer
from hivejobs.records.dispatch import Lease
from hivejobs.store import new_worker_id
from tests.harness import sql

_HOLDERS: dict[int, str] = {}


def leader(app: App) -> Lease:
    """Take (or renew) the lease as this app's one coordinator identity."""
    holder = _HOLDERS.setdefault(id(app), new_worker_id())
    term = app.connections.store.lease_acquire(holder, 30.0)
    assert term is not None
    return Lease(holder, term)


def make(app: App, database_url: str) -> App:
    @app.job("thing")
    def thing(ctx: object, payload: dict[str, int]) -> None: ...

    app.connections.store.upsert_job_types([app.types["thing"].info()])
    return app


def test_reconciler_repushes_a_job_redis_lost(
    make_app: Callable[..., App], database_url: str
) -> None:
    app = make(make_app(), database_url)
    app.connections.broker.set_boot_marker(
        "x"
    )  # not a flushed Redis: only the deficit path may act
    job_id = app.enqueue("thing", {"n": 1})
    assert app.flush()
    key = app.connections.broker.queue_key("thing", 0)
    app.connections.broker.redis.delete(key)  # lost between commit and push, or evicted
    sql(database_url, "UPDATE hivejobs_job SET queued_at = now() - interval '1 minute'")
    result = Reconciler(app.connections.store, app.connections.broker).run_once(leader(app))
    assert (result.full_restore, result.pushed) == (False, 1)
    assert app.connections.broker.redis.lrange(key, 0, -1) == [job_id.encode()]
    # Nothing missing any more: a second pass pushes nothing (no duplicate growth).
    assert (
        Reconciler(app.connections.store, app.connections.broker).run_once(leader(app)).pushed == 0
    )


def test_reconciler_repushes_a_lost_id_once_its_list_has_moved_past_it(
    make_app: Callable[..., App], database_url: str
) -> None:
    """A list is first in, first out: an id still queued and older than the list's head by
    more than the grace was lost. It is re-pushed, alone: the ids still in Redis are not
    pushed again, and one lost later than the head waits until the list gets to its turn."""
    app = make(make_app(), database_url)
    app.connections.broker.set_boot_marker("x")
    key = app.connections.broker.queue_key("thing", 0)
    lost = app.enqueue("thing", {"n": 0})
    later = app.enqueue("thing", {"n": 1})
    backlog = app.enqueue_many("thing", [{"n": i} for i in range(2, 10)])
    assert app.flush()
    app.connections.broker.redis.lrem(key, 0, lost)
    app.connections.broker.redis.lrem(
        key, 0, later
    )  # lost too, but queued after the backlog's head
    sql(
        database_url,
        "UPDATE hivejobs_job SET queued_at = now() - interval '1 minute' WHERE id = %s",
        (lost,),
    )
    sql(
        database_url,
        "UPDATE hivejobs_job SET queued_at = now() - interval '10 seconds' WHERE id <> %s",
        (lost,),
    )
    sql(database_url, "UPDATE hivejobs_job SET queued_at = now() WHERE id = %s", (later,))
    reconciler = Reconciler(app.connections.store, app.connections.broker)
    assert reconciler.run_once(leader(app)).pushed == 1
    listed = [
        i.decode() for i in app.connections.broker.redis.lrange(key, 0, -1) if isinstance(i, bytes)
    ]
    assert sorted(listed) == sorted([*backlog, lost])  # no id twice, `later` not yet
    assert reconciler.run_once(leader(app)).pushed == 0  # nothing older than the head now
    app.connections.broker.redis.delete(
        key
    )  # the backlog popped (and lost: Postgres still has it queued)
    sql(database_url, "UPDATE hivejobs_job SET queued_at = now() - interval '1 minute'")
    assert reconciler.run_once(leader(app)).pushed == 10  # an empty list: all past the grace


def test_reconciler_leaves_ids_queued_within_the_grace(
    make_app: Callable[..., App], database_url: str
) -> None:
    """An empty list and a row queued less than the grace ago: popped and about to be
    claimed, or enqueued and about to be pushed. Not pushed; once past the grace, it is."""
    app = make(make_app(), database_url)
    app.connections.broker.set_boot_marker("x")
    job_id = app.enqueue("thing", {"n": 1})
    assert app.flush()
    key = app.connections.broker.queue_key("thing", 0)
    app.connections.broker.redis.delete(key)
    reconciler = Reconciler(app.connections.store, app.connections.broker, grace_s=30.0)
    assert reconciler.run_once(leader(app)).pushed == 0
    sql(database_url, "UPDATE hivejobs_job SET queued_at = now() - interval '1 minute'")
    assert reconciler.run_once(leader(app)).pushed == 1
    assert app.connections.broker.redis.lrange(key, 0, -1) == [job_id.encode()]


def test_a_refused_key_is_logged_when_it_goes_bad_and_when_redis_accepts_it_again(
    make_app: Callable[..., App], database_url: str
) -> None:
    """A key of the wrong type is news once, and so is its healing; a pass that did not read
    the key (its queue has no queued row left) says nothing about it."""
    app = make(make_app(), database_url)
    app.connections.broker.set_boot_marker("x")
    key = app.connections.broker.queue_key("thing", 0)
    reconciler = Reconciler(app.connections.store, app.connections.broker)

    def lost_job() -> str:
        job_id = app.enqueue("thing", {"n": 1})
        assert app.flush()
        app.connections.broker.redis.delete(key)
        sql(database_url, "UPDATE hivejobs_job SET queued_at = now() - interval '1 minute'")
        return job_id

    def one_pass() -> list[str]:
        with logged() as lines:
            reconciler.run_once(leader(app))
        return [message for _, message in lines]

    app.enqueue("thing", {"n": 2}, priority=5)  # a list the passes go on reading
    stuck = lost_job()
    app.connections.broker.redis.set(key, "not a list")
    assert one_pass().count(MSG_KEY_REFUSED) == 1
    assert MSG_KEY_REFUSED not in one_pass()  # still refused: logged once
    assert app.cancel(stuck)
    assert MSG_KEY_ACCEPTED not in one_pass()  # no queued row: the key was not read
    lost_job()  # deletes the wrong-typed key, as an operator would
    assert MSG_KEY_ACCEPTED in one_pass()
    assert app.connections.broker.redis.llen(key) == 1
    assert (
        app.connections.broker.redis.llen(app.connections.broker.queue_key("thing", 5)) == 1
    )  # never pushed twice


def test_reconciler_restores_everything_after_a_flush(
    make_app: Callable[..., App], database_url: str
) -> None:
    app = make(make_app(), database_url)
    ids = app.enqueue_many("thing", [{"n": i} for i in range(25_000)])
    app.connections.broker.redis.delete(
        app.connections.broker.queue_key("thing", 0)
    )  # no boot marker either
    result = Reconciler(app.connections.store, app.connections.broker).run_once(leader(app))
    assert (result.full_restore, result.pushed) == (True, 25_000)
    listed = app.connections.broker.redis.lrange(
        app.connections.broker.queue_key("thing", 0), 0, -1
    )
    # Oldest first by queued_at; one COPY shares one queued_at, so within it by id.
    assert [i.decode() for i in listed if isinstance(i, bytes)] == sorted(ids)
    assert app.connections.broker.boot_marker_present()


def test_rescuer_waits_until_healthy_for_stuck_after(
    make_app: Callable[..., App], database_url: str
) -> None:
    app = make(make_app(stuck_after_s=5.0), database_url)
    job_id = app.enqueue("thing", {"n": 1})
    dead = new_worker_id()
    app.connections.store.register_worker(dead, "h", 1, "pool", "thing")
    sql(
        database_url,
        "UPDATE hivejobs_job SET state = 'running', attempt = 1, worker_id = %s, claim_token = 7",
        (dead,),
    )
    sql(database_url, "UPDATE hivejobs_worker SET heartbeat_at = now() - interval '1 minute'")
    rescuer = Rescuer(app.connections.store, app.connections.broker, app.settings)
    # R6: after an outage every heartbeat looks stale; no rescue until healthy long enough.
    assert rescuer.run_once(leader(app), healthy_for_s=1.0).skipped_unhealthy
    assert app.get_job(job_id).state == "running"
    result = rescuer.run_once(leader(app), healthy_for_s=6.0)
    assert (result.dead_workers, result.requeued, result.failed) == (1, 1, 0)
    info = app.get_job(job_id)
    assert (info.state, info.attempt, info.error) == ("queued", 1, "worker lost")


def test_rescue_with_a_stale_term_writes_nothing(
    make_app: Callable[..., App], database_url: str
) -> None:
    app = make(make_app(), database_url)
    app.enqueue("thing", {"n": 1})
    dead = new_worker_id()
    sql(
        database_url,
        "UPDATE hivejobs_job SET state = 'running', worker_id = %s, claim_token = 7",
        (dead,),
    )
    old = leader(app)
    sql(database_url, "UPDATE hivejobs_leader SET expires_at = now() - interval '1 second'")
    term = app.connections.store.lease_acquire(
        new_worker_id(), 30.0
    )  # another coordinator takes over
    assert term is not None
    new = ("other", term)
    assert new[1] == old[1] + 1  # a new holder, a new term
    assert app.connections.store.rescue_workers([dead], 3, lease=old) is None
    assert sql(database_url, "SELECT state FROM hivejobs_job")[0][0] == "running"


def test_elector_steps_down_when_its_trust_window_passes(make_app: Callable[..., App]) -> None:
    app = make_app(lease_ttl_s=1.2, lease_margin_s=0.2, lease_renew_s=10.0)
    elector = Elector(app.connections.store, new_worker_id(), app.settings)
    elector.tick()
    assert elector.lease is not None
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:  # no renewal happens before renew_s (10 s)
        time.sleep(0.05)
    assert elector.lease is None  # TTL - margin passed without a renewal


def test_gauges_record_depth_and_in_flight(make_app: Callable[..., App], database_url: str) -> None:
    app = make(make_app(), database_url)
    app.enqueue_many("thing", [{"n": i} for i in range(7)])
    gauges = Gauges(app.connections.store)
    assert gauges.in_flight is None  # no pass yet
    totals = gauges.run_once()
    assert totals == {"queued": 7, "running": 0}
    assert gauges.in_flight == 7  # what the compactor is gated on
    rows = dict(sql(database_url, "SELECT name, value FROM hivejobs_gauge WHERE queue = 'thing'"))
    assert rows == {"queued": 7, "running": 0}


def test_gauges_count_as_seldom_as_their_last_count_was_large(
    make_app: Callable[..., App], database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The queue depth counts every queued row (a count that grows with the backlog): after counting
    25,000 the gauges keep that count for 25,000 / ROWS_PER_SECOND_OF_AGE = 5 s, then count
    again. The 25,000 are a queue of nothing the test adds to the real counts; the clock is
    the test's."""
    app = make(make_app(), database_url)
    clock = [1000.0]
    monkeypatch.setattr("hivejobs.coordinator.gauges.time.monotonic", lambda: clock[0])
    count = app.connections.store.queued_counts
    monkeypatch.setattr(
        app.connections.store, "queued_counts", lambda: {**count(), ("ghost", 0): 25_000}
    )
    gauges = Gauges(app.connections.store, interval_s=1.0)
    app.enqueue_many("thing", [{"n": i} for i in range(3)])
    assert gauges.run_once()["queued"] == 25_003
    app.enqueue_many("thing", [{"n": i} for i in range(4)])
    clock[0] += 4.9
    assert gauges.run_once()["queued"] == 25_003  # the last count, 4.9 s old
    clock[0] += 0.2
    assert gauges.run_once()["queued"] == 25_007  # 5.1 s: counted again


def test_first_start_without_marker_does_not_push_ids_twice(
    make_app: Callable[..., App], database_url: str
) -> None:
    """A fresh Redis has no boot marker yet, but its lists already hold what enqueue pushed."""
    app = make(make_app(), database_url)
    app.enqueue_many("thing", [{"n": i} for i in range(100)])
    result = Reconciler(app.connections.store, app.connections.broker).run_once(leader(app))
    assert (result.full_restore, result.pushed) == (True, 0)
    assert app.connections.broker.redis.llen(app.connections.broker.queue_key("thing", 0)) == 100
    assert app.connections.broker.boot_marker_present()


@contextmanager
def logged() -> Iterator[list[tuple[str, str]]]:
    """(level, message) of each line hivejobs logs meanwhile (it is silent unless enabled)."""
    lines: list[tuple[str, str]] = []
    logger.enable("hivejobs")
    sink = logger.add(
        lambda m: lines.append((m.record["level"].name, m.record["message"])), level="DEBUG"
    )
    try:
        yield lines
    finally:
        logger.remove(sink)
        logger.disable("hivejobs")


def test_first_start_is_not_a_flush_but_a_later_missing_marker_is(
    make_app: Callable[..., App], database_url: str
) -> None:
    """On a first start a job popped between the reconciler's reads (by a worker whose claim
    is not made yet) is pushed again: harmless, and no sign of a flush."""
    app = make(make_app(), database_url)
    job_id = app.enqueue("thing", {"n": 1})
    assert app.flush()
    key = app.connections.broker.queue_key("thing", 0)
    assert app.connections.broker.redis.lpop(key) == job_id.encode()
    with logged() as lines:
        result = Reconciler(app.connections.store, app.connections.broker).run_once(leader(app))
    assert (result.full_restore, result.pushed) == (True, 1)
    levels = {level for level, _ in lines}
    assert "INFO" in levels and "WARNING" not in levels
    # The marker was set and Postgres remembers it: a Redis that lost it was flushed.
    app.connections.broker.redis.delete(key, app.connections.broker.boot_key)
    with logged() as lines:
        result = Reconciler(app.connections.store, app.connections.broker).run_once(leader(app))
    assert (result.full_restore, result.pushed) == (True, 1)
    assert app.connections.broker.redis.lrange(key, 0, -1) == [job_id.encode()]
    assert "WARNING" in {level for level, _ in lines}


def test_compactor_gives_a_drained_hot_table_its_space_back(
    make_app: Callable[..., App], database_url: str
) -> None:
    app = make(make_app(compact_above_bytes=512 * 1024), database_url)
    gauges = Gauges(app.connections.store)  # what the last gauges pass measured: queued + running
    compactor = Compactor(app.connections.store, app.settings, in_flight=lambda: gauges.in_flight)
    empty = app.connections.store.hot_table_size(1)[1]
    app.enqueue_many("thing", [{"n": i} for i in range(20_000)])
    full = app.connections.store.hot_table_size(1)[1]
    assert full > 512 * 1024
    assert _compact(compactor, gauges, 20_000) is False  # the gauges say it is not drained
    # The gauges lag: the count finds 20,000 live rows.
    assert _compact(compactor, gauges, 0) is False
    # Drain all but a few, as finished jobs leave the hot table for the archive.
    sql(
        database_url,
        "DELETE FROM hivejobs_job WHERE id NOT IN (SELECT id FROM hivejobs_job LIMIT 5)",
    )
    assert app.connections.store.hot_table_size(1)[1] == full  # deleting alone gives nothing back
    # An interrupted earlier rebuild leaves an invalid index behind: it must go too.
    with pytest.raises(psycopg.errors.UniqueViolation):
        sql(
            database_url,
            "CREATE UNIQUE INDEX CONCURRENTLY hivejobs_job_name_ccnew ON hivejobs_job (name)",
        )
    assert _compact(compactor, gauges, None) is False  # no gauges pass yet: no scan either
    assert _compact(compactor, gauges, 5) is True
    assert _compact(compactor, gauges, 5) is False  # one compaction at a time
    compactor.join(60)
    live, size = app.connections.store.hot_table_size(100)
    assert live == 5
    assert size < empty + 256 * 1024, (empty, size, full)
    assert sql(
        database_url,
        "SELECT count(*) FROM pg_index WHERE indrelid = 'hivejobs_job'::regclass AND indisvalid",
    )[0][0] == len(sql(database_url, "SELECT 1 FROM pg_indexes WHERE tablename = 'hivejobs_job'"))
    assert _compact(compactor, gauges, 5) is False  # compact now: nothing more to do


def _compact(compactor: Compactor, gauges: Gauges, in_flight: int | None) -> bool:
    """One compactor pass after a gauges pass that measured `in_flight`."""
    gauges.in_flight = in_flight
    return compactor.run_once()
