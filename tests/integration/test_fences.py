"""The claim, its fences and the store's other guards, statement by statement, on real
Postgres (bench/mutants.py removes each guard and expects these tests to fail).

A job runs twice if a claim takes a row that is not queued, or if a write from an old claim
(rescued, timed out, released) lands on the claim another worker now holds. Each test builds
the state by hand, calls one store verb, and compares whole rows before and after.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from hivejobs import App
from hivejobs.records.dispatch import Lease, Push
from hivejobs.records.jobs import ClaimedJob, Completion, Outcome
from hivejobs.store import new_worker_id
from tests.harness import sql

ROW = (
    "SELECT state, attempt, worker_id::text, claim_token, run_at, queued_at, error,"
    " cancel_requested FROM hivejobs_job WHERE id = %s"
)


def make(app: App) -> App:
    app.job("thing", attempts=5)(lambda ctx, payload: None)
    app.connections.store.upsert_job_types([jt.info() for jt in app.types.values()])
    return app


def claim(app: App, ids: list[str], worker_id: str | None = None) -> list[ClaimedJob]:
    with app.connections.store.connection() as conn:
        return app.connections.store.claim_queued(
            ids, worker_id or new_worker_id(), conn, name="thing"
        )


def row(database_url: str, job_id: str) -> tuple[Any, ...]:
    rows = sql(database_url, ROW, (job_id,))
    assert len(rows) == 1, f"{job_id} is not live"
    return tuple(rows[0])


def test_claim_takes_only_queued_rows(make_app: Callable[..., App], database_url: str) -> None:
    """A running row (another worker's claim), a scheduled one (a delay or a retry's backoff)
    and an expired one are not claimed, and their rows are left exactly as they were."""
    app = make(make_app())
    running, queued = app.enqueue_many("thing", [{"n": 1}, {"n": 2}])
    scheduled = app.enqueue("thing", {"n": 3}, delay=600.0)
    expired = app.enqueue("thing", {"n": 4})
    sql(
        database_url,
        "UPDATE hivejobs_job SET expires_at = now() - interval '1 second' WHERE id = %s",
        (expired,),
    )
    [held] = claim(app, [running])
    assert held.attempt == 1
    before = {i: row(database_url, i) for i in (running, scheduled, expired)}

    got = claim(app, [running, queued, scheduled, expired])

    assert [j.id for j in got] == [queued]
    assert {i: row(database_url, i) for i in before} == before
    assert before[running][:2] == ("running", 1)  # claimed once, counted once


def test_claim_refuses_a_running_id_claimed_again_by_its_own_pool(
    make_app: Callable[..., App],
) -> None:
    """The same id popped twice (a Redis re-push while it runs) by the pool that holds it."""
    app = make(make_app())
    job_id = app.enqueue("thing", {})
    worker = new_worker_id()
    [first] = claim(app, [job_id], worker)
    assert claim(app, [job_id], worker) == []
    assert claim(app, [job_id, job_id]) == []
    assert first.attempt == 1


NEW_HOLDER = new_worker_id()


def _reclaimed(app: App) -> tuple[str, ClaimedJob, ClaimedJob]:
    """A job whose first claim was released (as a rescue or a lost completion would) and
    claimed again: (id, the stale claim, the current one)."""
    job_id = app.enqueue("thing", {})
    worker = new_worker_id()
    [old] = claim(app, [job_id], worker)
    assert app.connections.store.release_claims(worker, [(job_id, old.claim_token)]) == [
        (job_id, "thing", 0)
    ]
    [new] = claim(app, [job_id], NEW_HOLDER)
    assert new.claim_token != old.claim_token
    return job_id, old, new


STALE: list[tuple[Outcome, float]] = [
    ("succeeded", 0.0),
    ("failed", 0.0),
    ("cancelled", 0.0),
    ("retry", 0.0),
    ("retry", 30.0),
    ("suspend", 0.0),
    ("await_callback", 0.0),
]


@pytest.mark.parametrize(("outcome", "delay_s"), STALE, ids=[f"{o}-{d}" for o, d in STALE])
def test_a_stale_claims_completion_writes_nothing(
    make_app: Callable[..., App], database_url: str, outcome: Outcome, delay_s: float
) -> None:
    """Every outcome a pool can write, from the old claim: nothing written, nothing archived,
    the current holder's row unchanged; the current claim's own completion then lands."""
    app = make(make_app())
    job_id, old, new = _reclaimed(app)
    before = row(database_url, job_id)
    stale = Completion(
        id=job_id,
        claim_token=old.claim_token,
        outcome=outcome,
        error="late",
        retry_delay_s=delay_s,
        callback_timeout_s=60.0,
    )
    with app.connections.store.connection() as conn:
        written, requeued = app.connections.store.finish([stale], conn)
    assert (written, requeued) == (0, [])
    assert row(database_url, job_id) == before
    assert sql(database_url, "SELECT count(*) FROM hivejobs_archive")[0][0] == 0

    current = Completion(id=job_id, claim_token=new.claim_token, outcome="succeeded")
    with app.connections.store.connection() as conn:
        assert app.connections.store.finish([current], conn) == (1, [])
    assert sql(database_url, "SELECT state FROM hivejobs_archive WHERE id = %s", (job_id,)) == [
        ("succeeded",)
    ]


def test_a_stale_claims_completion_in_a_mixed_batch_touches_only_its_own_rows(
    make_app: Callable[..., App], database_url: str
) -> None:
    """A group-commit batch mixes stale and current completions: the fence is per row."""
    app = make(make_app())
    job_id, old, new = _reclaimed(app)
    other = app.enqueue("thing", {})
    [mine] = claim(app, [other])
    before = row(database_url, job_id)
    batch = [
        Completion(id=job_id, claim_token=old.claim_token, outcome="failed", error="late"),
        Completion(id=other, claim_token=mine.claim_token, outcome="succeeded"),
    ]
    with app.connections.store.connection() as conn:
        assert app.connections.store.finish(batch, conn) == (1, [])
    assert row(database_url, job_id) == before
    archived = sql(database_url, "SELECT id FROM hivejobs_archive")
    assert archived == [(other,)]


def test_a_stale_claims_release_writes_nothing(
    make_app: Callable[..., App], database_url: str
) -> None:
    app = make(make_app())
    job_id, old, new = _reclaimed(app)
    before = row(database_url, job_id)
    store = app.connections.store
    assert store.release_claims(NEW_HOLDER, [(job_id, old.claim_token)]) == []
    assert row(database_url, job_id) == before
    assert store.release_claims(new_worker_id(), [(job_id, new.claim_token)]) == []
    assert row(database_url, job_id) == before
    assert store.release_claims(NEW_HOLDER, [(job_id, new.claim_token)]) == [(job_id, "thing", 0)]
    assert row(database_url, job_id)[:4] == ("queued", 2, None, None)


def test_a_claim_ended_awaiting_its_callback_is_not_released(
    make_app: Callable[..., App], database_url: str
) -> None:
    """The pool's check for claims it no longer tracks reads its running rows, then compares
    them with what it holds; a callback type's completion written in between ends the claim
    but keeps the row running with its token. Released, the job would run again at the next
    attempt and the other service's answer for this one would be refused."""
    app = make(make_app())
    job_id = app.enqueue("thing", {})
    worker = new_worker_id()
    [held] = claim(app, [job_id], worker)
    read = app.connections.store.running_claims(worker)
    assert [(c.id, c.claim_token) for c in read] == [(job_id, held.claim_token)]
    handed = Completion(
        id=job_id, claim_token=held.claim_token, outcome="await_callback", callback_timeout_s=60
    )
    with app.connections.store.connection() as conn:
        assert app.connections.store.finish([handed], conn) == (1, [])
    before = row(database_url, job_id)
    assert before[:3] == ("running", 1, None)

    assert app.connections.store.release_claims(worker, read) == []
    assert row(database_url, job_id) == before


def test_release_unstarted_takes_back_only_this_workers_running_claims(
    make_app: Callable[..., App], database_url: str
) -> None:
    """A claim whose commit outcome was unknown goes back uncounted; a worker that does not
    hold the id (it never committed, another worker claimed it since) writes nothing."""
    app = make(make_app())
    held_id, queued_id = app.enqueue_many("thing", [{"n": 1}, {"n": 2}])
    holder, other = new_worker_id(), new_worker_id()
    claim(app, [held_id], holder)
    before = {i: row(database_url, i) for i in (held_id, queued_id)}
    assert app.connections.store.release_unstarted([held_id, queued_id], other) == []
    assert {i: row(database_url, i) for i in before} == before
    assert app.connections.store.release_unstarted([held_id, queued_id], holder) == [
        (held_id, "thing", 0)
    ]
    assert row(database_url, held_id)[:4] == ("queued", 0, None, None)
    assert row(database_url, queued_id) == before[queued_id]  # queued: not taken "back"


def test_a_stale_claim_does_not_drop_an_archived_duplicate(
    make_app: Callable[..., App], database_url: str
) -> None:
    """A live row whose id is archived is dropped only by the claim that holds it."""
    app = make(make_app())
    job_id, old, new = _reclaimed(app)
    sql(
        database_url,
        "INSERT INTO hivejobs_archive (id, name, state, priority, attempt, attempts, delivery,"
        " payload, created_at, run_at) SELECT id, name, 'succeeded', priority, attempt,"
        " attempts, delivery, payload, created_at, run_at FROM hivejobs_job WHERE id = %s",
        (job_id,),
    )
    before = row(database_url, job_id)
    assert (
        app.connections.store.drop_archived_duplicate_if_running(job_id, old.claim_token) is False
    )
    assert row(database_url, job_id) == before
    assert app.connections.store.drop_archived_duplicate_if_running(job_id, new.claim_token) is True
    assert sql(database_url, "SELECT count(*) FROM hivejobs_job")[0][0] == 0


# (delivery, attempt, attempts, lost, cancel_requested) -> where the rescue puts the claim.
RESCUES: dict[str, tuple[str, int, int, int, bool, tuple[str, str]]] = {
    "at least once, attempts left": ("at_least_once", 1, 3, 0, False, ("queued", "worker lost")),
    # Attempts left in the row: the store does not lean on the type's own check (one attempt).
    "at most once": ("at_most_once", 1, 3, 0, False, ("failed", "worker lost")),
    "last attempt": ("at_least_once", 3, 3, 0, False, ("failed", "worker lost")),
    "poison pill": ("at_least_once", 1, 5, 2, False, ("failed", "worker lost (poison pill")),
    "cancel requested": ("at_least_once", 1, 3, 0, True, ("cancelled", "worker lost")),
}


def test_a_dead_workers_claims_go_where_their_delivery_says(
    make_app: Callable[..., App], database_url: str
) -> None:
    """At-most-once and maybe started: failed, never requeued; at-least-once: requeued while
    attempts are left and the job has not killed its process `poison_after` times; a cancel
    asked for meanwhile ends it cancelled. A live worker's claim is not touched."""
    app = make(make_app())
    ids = dict(zip(RESCUES, app.enqueue_many("thing", [{}] * len(RESCUES)), strict=True))
    dead, alive = new_worker_id(), new_worker_id()
    for case, (delivery, attempt, attempts, lost, cancel, _) in RESCUES.items():
        sql(
            database_url,
            "UPDATE hivejobs_job SET state = 'running', worker_id = %s, claim_token = 1,"
            " delivery = %s, attempt = %s, attempts = %s, lost = %s, cancel_requested = %s"
            " WHERE id = %s",
            (dead, delivery, attempt, attempts, lost, cancel, ids[case]),
        )
    bystander = app.enqueue("thing", {})
    claim(app, [bystander], alive)
    before = row(database_url, bystander)

    rescued = app.connections.store.rescue_workers([dead], poison_after=3)

    assert rescued is not None
    assert [p.id for p in rescued.requeued] == [ids["at least once, attempts left"]]
    assert rescued.failed == len(RESCUES) - 1
    ended = dict(
        sql(database_url, "SELECT id, state || ': ' || coalesce(error, '') FROM hivejobs_job")
        + sql(database_url, "SELECT id, state || ': ' || coalesce(error, '') FROM hivejobs_archive")
    )
    for case, (*_, (state, error)) in RESCUES.items():
        assert ended[ids[case]].startswith(f"{state}: {error}"), case
    assert row(database_url, bystander) == before


@pytest.mark.parametrize(
    ("outcome", "archived"),
    [("succeeded", "succeeded"), ("failed", "cancelled"), ("cancelled", "cancelled")],
)
def test_a_cancel_of_a_running_job_is_a_request_that_its_outcome_answers(
    make_app: Callable[..., App], database_url: str, outcome: Outcome, archived: str
) -> None:
    """The running row is not ended by the cancel (its handler may still run): it is marked,
    and the attempt's own end decides: work that completed stays succeeded, a failure ends
    cancelled."""
    app = make(make_app())
    job_id = app.enqueue("thing", {})
    [held] = claim(app, [job_id])
    assert app.connections.store.cancel(job_id) == "requested"
    assert row(database_url, job_id)[0] == "running"
    assert sql(database_url, "SELECT count(*) FROM hivejobs_archive")[0][0] == 0
    done = Completion(id=job_id, claim_token=held.claim_token, outcome=outcome, error="x")
    with app.connections.store.connection() as conn:
        app.connections.store.finish([done], conn)
    assert sql(database_url, "SELECT state FROM hivejobs_archive") == [(archived,)]


def test_promotion_takes_only_scheduled_jobs_that_are_due(
    make_app: Callable[..., App], database_url: str
) -> None:
    """A delay or a retry's backoff is kept to: the job due is queued; one due in an hour, and
    a running one (its run_at long past), stay as they were."""
    app = make(make_app())
    due, later = app.enqueue_many("thing", [{"n": 1}, {"n": 2}], delay=600.0)
    running = app.enqueue("thing", {"n": 3})
    claim(app, [running])
    sql(
        database_url,
        "UPDATE hivejobs_job SET run_at = now() + CASE id WHEN %s THEN interval '1 hour'"
        " ELSE interval '-1 hour' END",
        (later,),
    )
    before = {i: row(database_url, i) for i in (later, running)}
    holder = new_worker_id()
    term = app.connections.store.lease_acquire(holder, 30.0)
    assert term is not None
    assert app.connections.store.promote_due_if_leader(Lease(holder, term), 100) == [
        Push(due, "thing", 0)
    ]
    assert row(database_url, due)[0] == "queued"
    assert {i: row(database_url, i) for i in before} == before
