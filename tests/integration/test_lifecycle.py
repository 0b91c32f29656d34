"""Every state a job passes through, on real Redis and Postgres.

scheduled -(Promoter pass)-> queued -(pool claim)-> running -> succeeded | failed | cancelled;
waiting jobs past expires_at -> expired. A real Pool runs in a thread of the test process;
the Promoter is driven one run_once() pass at a time with a lease taken from the store.
Handlers report through Events and lists; every cross-thread wait has a deadline.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

import msgspec
import pytest

from hivejobs import (
    App,
    Backoff,
    Interrupted,
    JobContext,
    JobInfo,
    JobNotFinished,
    JobNotFound,
    Retry,
)
from hivejobs.coordinator.promoter import Promoter, PromoteResult
from hivejobs.records.dispatch import Lease
from hivejobs.store import new_worker_id
from hivejobs.worker.process import Pool
from tests.harness import wait_until

# A short blocking pop, so that a stopped pool's fetcher lets go quickly.
FAST = {"pop_block_s": 0.2, "redis_socket_timeout_s": 2.0}
Payload = dict[str, int]


class Resize(msgspec.Struct):
    width: int
    height: int


StartPool = Callable[[App, str], Pool]


def start_pool_thread(app: App, name: str) -> tuple[Pool, threading.Thread]:
    """A real Pool, run in a thread of the test process (its signal handlers stay off)."""
    pool = Pool(app, app.types[name], new_worker_id(), app.settings)
    thread = threading.Thread(target=pool.run, name=f"pool-{name}", daemon=True)
    thread.start()
    return pool, thread


def stop_pool_thread(pool: Pool, thread: threading.Thread) -> None:
    """Join a pool thread after `pool.stop.signal()`, then close its connections once no
    thread of it uses them: its blocking pop ends within pop_block_s and its control
    subscription within a poll (closing Redis under them would raise)."""
    thread.join(15)
    assert not thread.is_alive(), "pool did not stop"
    assert pool.fetcher.join(5), "fetcher thread did not stop"
    assert pool.liveness.join(5), "heartbeat and control threads did not stop"
    pool.close()


@pytest.fixture
def start_pool(make_app: Callable[..., App]) -> Iterator[StartPool]:
    """Start a pool thread for one job type; stopped (as on SIGTERM) after the test."""
    started: list[tuple[Pool, threading.Thread]] = []

    def start(app: App, name: str) -> Pool:
        pool, thread = start_pool_thread(app, name)
        started.append((pool, thread))
        wait_until(
            lambda: (
                pool.liveness.subscribed.is_set()
                and any(w.id == pool.worker_id for w in app.connections.store.workers())
            ),
            timeout=30,
            what="pool registered and listening for control messages",
        )
        return pool

    yield start
    for pool, _ in started:
        pool.stop.signal()
    for pool, thread in started:
        stop_pool_thread(pool, thread)


def take_lease(app: App) -> tuple[Promoter, Lease]:
    holder = new_worker_id()
    term = app.connections.store.lease_acquire(holder, 60.0)
    assert term is not None
    return Promoter(app.connections.store, app.connections.broker), Lease(holder, term)


def promote_until(
    app: App,
    job_id: str,
    state: str,
    timeout: float = 10.0,
    leased: tuple[Promoter, Lease] | None = None,
) -> JobInfo:
    """Run Promoter passes, as the coordinator's loop does, until the job is in `state`."""
    promoter, lease = leased or take_lease(app)

    def reached() -> JobInfo | None:
        promoter.run_once(lease)
        info = app.get_job(job_id)
        return info if info.state == state else None

    return wait_until(reached, timeout=timeout, what=f"job {state}")  # type: ignore[no-any-return]


def reach(app: App, job_id: str, state: str, timeout: float = 30.0) -> JobInfo:
    def reached() -> JobInfo | None:
        info = app.get_job(job_id)
        return info if info.state == state else None

    return wait_until(reached, timeout=timeout, what=f"job {state}")  # type: ignore[no-any-return]


def queued_ids(app: App, name: str, priority: int = 0) -> list[str]:
    assert app.flush()  # single enqueues push to Redis after returning
    key = app.connections.broker.queue_key(name, priority)
    return [raw.decode() for raw in app.connections.broker.redis.lrange(key, 0, -1)]  # type: ignore[union-attr]


def live_rows(app: App) -> int:
    with app.connections.store.connection() as conn:
        row = conn.execute("SELECT count(*) FROM hivejobs_job").fetchone()
    assert row is not None
    return int(row[0])


def in_future(seconds: float) -> datetime:
    return datetime.now(UTC) + timedelta(seconds=seconds)


# -- scheduled -> queued ------------------------------------------------------------------


@pytest.mark.parametrize("how", ["delay", "run_at"])
def test_scheduled_job_is_queued_by_one_promoter_pass_once_due(
    make_app: Callable[..., App], how: str
) -> None:
    app = make_app()
    app.job("resize")(lambda ctx, payload: None)
    before = app.connections.store.now()
    when = {"delay": 0.6} if how == "delay" else {"run_at": in_future(0.6)}
    job_id = app.enqueue("resize", {"w": 1}, **when)

    info = app.get_job(job_id)
    assert info.state == "scheduled"
    assert info.run_at - before >= timedelta(seconds=0.5)
    assert queued_ids(app, "resize") == []
    promoter, lease = take_lease(app)
    assert promoter.run_once(lease).promoted == 0  # not due yet

    wait_until(lambda: app.connections.store.now() >= info.run_at, timeout=5, what="run_at passed")
    stale = Lease(new_worker_id(), lease[1] + 1)
    assert promoter.run_once(stale).promoted == 0  # a lease we do not hold writes nothing
    assert app.get_job(job_id).state == "scheduled"

    assert promoter.run_once(lease).promoted == 1
    assert app.get_job(job_id).state == "queued"
    assert queued_ids(app, "resize") == [job_id]
    assert promoter.run_once(lease).promoted == 0  # promoted, and pushed, exactly once


# -- queued -> running -> succeeded / failed ----------------------------------------------


def test_job_runs_from_queued_through_running_to_succeeded(
    make_app: Callable[..., App], start_pool: StartPool
) -> None:
    app = make_app(**FAST)
    release = threading.Event()
    seen: list[tuple[str, int, Payload]] = []

    @app.job("resize", concurrency=2)
    def resize(ctx: JobContext, payload: Payload) -> Payload:
        seen.append((ctx.job_id, ctx.attempt, payload))
        release.wait(10)
        return {"area": payload["w"] * payload["h"]}

    job_id = app.enqueue("resize", {"w": 3, "h": 4})
    assert app.get_job(job_id).state == "queued"
    assert queued_ids(app, "resize") == [job_id]
    start_pool(app, "resize")

    running = reach(app, job_id, "running")
    assert running.attempt == 1 and running.started_at is not None
    assert running.finished_at is None
    release.set()
    done = reach(app, job_id, "succeeded")
    assert done.result == {"area": 12}
    assert done.attempt == 1 and done.error is None
    assert done.finished_at is not None and done.finished_at >= running.started_at
    assert seen == [(job_id, 1, {"w": 3, "h": 4})]
    assert live_rows(app) == 0  # finished jobs leave the hot table


def test_failing_job_retries_with_backoff_then_fails_keeping_the_last_error(
    make_app: Callable[..., App], start_pool: StartPool
) -> None:
    app = make_app(**FAST)
    attempts: list[int] = []

    @app.job("flaky", attempts=3, backoff=Backoff(base_s=0.05, max_s=0.05))
    def flaky(ctx: JobContext, payload: Payload) -> None:
        attempts.append(ctx.attempt)
        raise ValueError(f"attempt {ctx.attempt} broke")

    job_id = app.enqueue("flaky", {"n": 1})
    start_pool(app, "flaky")

    # No promoter runs yet: after the first failure the retry waits, scheduled.
    first = reach(app, job_id, "scheduled")
    assert first.attempt == 1 and first.attempts == 3
    assert first.error is not None and "ValueError: attempt 1 broke" in first.error
    assert first.started_at is not None and first.run_at > first.started_at

    final = promote_until(app, job_id, "failed")
    assert attempts == [1, 2, 3]
    assert final.attempt == 3 and final.attempts == 3
    assert final.error is not None
    assert final.error.startswith("Traceback (most recent call last)")
    assert "ValueError: attempt 3 broke" in final.error
    assert "attempt 2 broke" not in final.error
    assert live_rows(app) == 0


def test_retry_delay_is_honoured_on_the_database_clock(
    make_app: Callable[..., App], start_pool: StartPool
) -> None:
    app = make_app(**FAST)

    @app.job("later", attempts=3)
    def later(ctx: JobContext, payload: Payload) -> None:
        raise Retry(delay=30, reason="rate limited")

    before = app.connections.store.now()
    job_id = app.enqueue("later", {})
    start_pool(app, "later")
    info = reach(app, job_id, "scheduled")
    after = app.connections.store.now()

    # Not the default backoff (about 1 s): the delay the handler asked for, from now().
    assert before + timedelta(seconds=30) <= info.run_at <= after + timedelta(seconds=30)
    assert info.attempt == 1
    assert info.error == "Retry: rate limited"
    promoter, lease = take_lease(app)
    assert promoter.run_once(lease).promoted == 0
    assert app.get_job(job_id).state == "scheduled"


def test_retry_counts_as_an_attempt_and_the_next_one_can_succeed(
    make_app: Callable[..., App], start_pool: StartPool
) -> None:
    app = make_app(**FAST)

    @app.job("twice", attempts=3)
    def twice(ctx: JobContext, payload: Payload) -> int:
        if ctx.attempt == 1:
            raise Retry(delay=0)  # no delay: back in the queue and pushed by the completer
        return ctx.attempt

    job_id = app.enqueue("twice", {})
    start_pool(app, "twice")
    info = reach(app, job_id, "succeeded")
    assert (info.attempt, info.result) == (2, 2)


def test_retry_with_an_unusable_delay_does_not_stall_the_pool(
    make_app: Callable[..., App], start_pool: StartPool
) -> None:
    """While failing, this leaves a completer thread retrying its batch for ever (as in a
    pool process), and its teardown waits out the pool's 5 s completion flush."""
    app = make_app(**FAST)

    @app.job("odd", attempts=3)
    def odd(ctx: JobContext, payload: Payload) -> str:
        if payload["bad"]:
            raise Retry(delay=math.nan)  # inf or 1e300 do the same
        return "ok"

    bad = app.enqueue("odd", {"bad": 1})
    start_pool(app, "odd")
    wait_until(lambda: app.get_job(bad).attempt == 1, timeout=30, what="bad job claimed")
    good = app.enqueue("odd", {"bad": 0})
    reach(app, good, "succeeded")
    wait_until(
        lambda: app.get_job(bad).state != "running",
        timeout=30,
        what="the retry of the bad job written",
    )


def test_at_most_once_job_fails_after_one_attempt(
    make_app: Callable[..., App], start_pool: StartPool
) -> None:
    app = make_app(**FAST)
    calls: list[int] = []

    @app.job("charge", delivery="at_most_once")
    def charge(ctx: JobContext, payload: Payload) -> None:
        calls.append(ctx.attempt)
        raise RuntimeError("card declined")

    job_id = app.enqueue("charge", {"cents": 500})
    start_pool(app, "charge")
    info = reach(app, job_id, "failed")
    assert (info.attempt, info.attempts, info.delivery) == (1, 1, "at_most_once")
    assert info.error is not None and "RuntimeError: card declined" in info.error
    assert calls == [1]
    assert live_rows(app) == 0  # no retry waiting anywhere


def test_payload_that_no_longer_decodes_fails_without_retrying(
    make_app: Callable[..., App], start_pool: StartPool
) -> None:
    """Schema drift: stored under an old schema, the new handler's type rejects it."""
    old = make_app(**FAST)
    old.job("resize")(lambda ctx, payload: None)
    job_id = old.enqueue("resize", {"width": "640", "height": 480})

    app = make_app(**FAST)
    calls: list[Resize] = []

    @app.job("resize", attempts=5)
    def resize(ctx: JobContext, payload: Resize) -> None:
        calls.append(payload)

    start_pool(app, "resize")
    info = reach(app, job_id, "failed")
    assert info.attempt == 1
    assert info.error is not None and "stored payload does not decode" in info.error
    assert calls == []


# -- cancel -------------------------------------------------------------------------------


def test_cancel_queued_job_ends_it_and_it_never_runs(
    make_app: Callable[..., App], start_pool: StartPool
) -> None:
    app = make_app(**FAST)
    ran: list[str] = []
    app.job("resize", concurrency=1)(lambda ctx, payload: ran.append(ctx.job_id))

    doomed = app.enqueue("resize", {"w": 1})
    assert app.cancel(doomed) is True
    info = app.get_job(doomed)
    assert info.state == "cancelled"
    assert info.started_at is None and info.finished_at is not None and info.attempt == 0
    assert app.cancel(doomed) is False  # already finished

    # Its id is still first in the Redis list: the claim must skip it.
    assert queued_ids(app, "resize") == [doomed]
    sentinel = app.enqueue("resize", {"w": 2})
    start_pool(app, "resize")
    reach(app, sentinel, "succeeded")
    assert ran == [sentinel]
    assert app.get_job(doomed).state == "cancelled"


def test_cancel_scheduled_job_ends_it_before_promotion(make_app: Callable[..., App]) -> None:
    app = make_app()
    app.job("resize")(lambda ctx, payload: None)
    job_id = app.enqueue("resize", {"w": 1}, delay=60)
    assert app.cancel(job_id) is True
    assert app.get_job(job_id).state == "cancelled"
    promoter, lease = take_lease(app)
    assert promoter.run_once(lease).promoted == 0
    assert live_rows(app) == 0 and queued_ids(app, "resize") == []
    with pytest.raises(JobNotFound, match="no job with id 'nope'"):
        app.cancel("nope")


def test_cancel_running_job_sets_stopping_and_it_ends_cancelled(
    make_app: Callable[..., App], start_pool: StartPool
) -> None:
    app = make_app(**FAST)
    started = threading.Event()
    saw: list[bool] = []

    @app.job("long", attempts=3)
    def long(ctx: JobContext, payload: Payload) -> str:
        started.set()
        if not ctx.stopping.wait(10):
            return "not cancelled"
        saw.append(ctx.cancelled)
        raise Interrupted()

    job_id = app.enqueue("long", {})
    start_pool(app, "long")
    wait_until(started.is_set, timeout=30, what="handler started")
    assert app.get_job(job_id).state == "running"
    assert app.cancel(job_id) is True
    info = reach(app, job_id, "cancelled")
    assert saw == [True]
    assert info.attempt == 1  # attempts were left, yet a cancelled job is not retried
    assert live_rows(app) == 0


# -- expired ------------------------------------------------------------------------------


@pytest.mark.parametrize("delay", [None, 60.0])
def test_waiting_job_past_expires_at_ends_expired(
    make_app: Callable[..., App], delay: float | None
) -> None:
    app = make_app()
    app.job("resize")(lambda ctx, payload: None)
    expires = in_future(0.4)
    job_id = app.enqueue("resize", {"w": 1}, delay=delay, expires_at=expires)
    assert app.get_job(job_id).state == ("queued" if delay is None else "scheduled")
    promoter, lease = take_lease(app)
    assert promoter.run_once(lease).ended == 0

    info = promote_until(app, job_id, "expired", timeout=5, leased=(promoter, lease))
    assert info.finished_at is not None and info.finished_at >= expires
    assert info.started_at is None and info.attempt == 0
    assert live_rows(app) == 0


def test_waiting_jobs_are_swept_once_per_interval_while_due_ones_are_promoted_every_pass(
    make_app: Callable[..., App],
) -> None:
    """Promotion runs every pass (a scheduled job starts within one), the sweep of
    expired jobs once per `end_every_s` (an expiry is not a start time; each sweep is a
    transaction, five a second would be the idle coordinator's largest cost to Postgres)."""
    app = make_app()
    app.job("resize")(lambda ctx, payload: None)
    holder = new_worker_id()
    term = app.connections.store.lease_acquire(holder, 60.0)
    assert term is not None
    lease = Lease(holder, term)
    promoter = Promoter(app.connections.store, app.connections.broker, end_every_s=3600.0)
    expires = in_future(0.2)
    first = app.enqueue("resize", {"w": 1}, expires_at=expires)
    wait_until(lambda: app.connections.store.now() > expires, timeout=5, what="expiry passed")
    assert promoter.run_once(lease).ended == 1  # the first pass sweeps
    assert app.get_job(first).state == "expired"
    expires = in_future(0.2)
    second = app.enqueue("resize", {"w": 2}, expires_at=expires)
    app.enqueue("resize", {"w": 3}, delay=0.1)  # due before `second` expires
    wait_until(lambda: app.connections.store.now() > expires, timeout=5, what="expiry passed")
    assert promoter.run_once(lease) == PromoteResult(promoted=1, ended=0)
    assert app.get_job(second).state == "queued"  # left for the next sweep
    promoter.end_every_s = 0.0
    assert promoter.run_once(lease).ended == 1
    assert app.get_job(second).state == "expired"


def test_expired_queued_job_is_never_claimed(
    make_app: Callable[..., App], start_pool: StartPool
) -> None:
    """Between expires_at and the promoter's pass the id may still be popped: no run."""
    app = make_app(**FAST)
    ran: list[str] = []
    app.job("resize", concurrency=1)(lambda ctx, payload: ran.append(ctx.job_id))
    expires = in_future(0.3)
    doomed = app.enqueue("resize", {"w": 1}, expires_at=expires)
    wait_until(lambda: app.connections.store.now() > expires, timeout=5, what="expiry passed")

    sentinel = app.enqueue("resize", {"w": 2})
    start_pool(app, "resize")
    reach(app, sentinel, "succeeded")
    assert ran == [sentinel]
    assert app.get_job(doomed).state == "queued"  # not run; the promoter ends it
    promote_until(app, doomed, "expired", timeout=5)


# -- replay and finished ids --------------------------------------------------------------


def test_replay_of_finished_job_runs_it_again_under_a_new_id(
    make_app: Callable[..., App], start_pool: StartPool
) -> None:
    app = make_app(**FAST)
    seen: list[tuple[str, Payload]] = []

    @app.job("resize", priority=3)
    def resize(ctx: JobContext, payload: Payload) -> None:
        seen.append((ctx.job_id, payload))

    first = app.enqueue("resize", {"w": 7, "h": 2})
    start_pool(app, "resize")
    reach(app, first, "succeeded")

    second = app.replay(first)
    assert second != first
    info = reach(app, second, "succeeded")
    assert (info.payload, info.priority, info.attempt) == ({"w": 7, "h": 2}, 3, 1)
    assert seen == [(first, {"w": 7, "h": 2}), (second, {"w": 7, "h": 2})]
    assert app.get_job(first).state == "succeeded"  # the original is left as it was


def test_replay_of_cancelled_job_is_queued_and_pushed(make_app: Callable[..., App]) -> None:
    app = make_app()
    app.job("resize")(lambda ctx, payload: None)
    old = app.enqueue("resize", {"w": 1}, priority=5)
    app.cancel(old)
    new = app.replay(old)
    info = app.get_job(new)
    assert (info.state, info.payload, info.priority, info.attempt) == ("queued", {"w": 1}, 5, 0)
    # The cancelled original's id stays in the list until a pool pops and skips it.
    assert queued_ids(app, "resize", priority=5) == [old, new]


def test_replay_keeps_the_delay_from_now(make_app: Callable[..., App]) -> None:
    """rickover's replay keeps the options: a delayed job is delayed again, from now."""
    app = make_app()
    app.job("resize")(lambda ctx, payload: None)
    old = app.enqueue("resize", {"w": 1}, priority=5, delay=60)
    app.cancel(old)
    done = app.replay_job(old)
    info = app.get_job(done.id)
    assert (info.state, info.priority) == ("scheduled", 5)
    assert 59 <= (info.run_at - info.created_at).total_seconds() <= 61
    assert done.changes == ["run_at: 60s from now, as the original's delay"]
    assert queued_ids(app, "resize", priority=5) == []


@pytest.mark.parametrize("delay", [None, 60.0])
def test_replay_of_live_job_raises_job_not_finished(
    make_app: Callable[..., App], delay: float | None
) -> None:
    app = make_app()
    app.job("resize")(lambda ctx, payload: None)
    job_id = app.enqueue("resize", {"w": 1}, delay=delay)
    state = "queued" if delay is None else "scheduled"
    with pytest.raises(JobNotFinished) as info:
        app.replay(job_id)
    assert str(info.value) == (f"job {job_id!r} is {state}: only a finished job can be replayed")
    assert live_rows(app) == 1
    with pytest.raises(JobNotFound):
        app.replay("no-such-job")


def test_reenqueue_of_finished_id_returns_it_and_does_not_run_it_again(
    make_app: Callable[..., App], start_pool: StartPool
) -> None:
    app = make_app(**FAST)
    ran: list[str] = []
    app.job("mail", concurrency=1)(lambda ctx, payload: ran.append(ctx.job_id))

    assert app.enqueue("mail", {"to": 1}, id="welcome-42") == "welcome-42"
    start_pool(app, "mail")
    done = reach(app, "welcome-42", "succeeded")

    assert app.enqueue("mail", {"to": 1}, id="welcome-42") == "welcome-42"
    sentinel = app.enqueue("mail", {"to": 2})
    reach(app, sentinel, "succeeded")
    assert ran == ["welcome-42", sentinel]
    again = app.get_job("welcome-42")
    assert (again.state, again.finished_at) == ("succeeded", done.finished_at)
    assert live_rows(app) == 0
