"""Completions and claims that must not touch other jobs, on real Redis and Postgres."""

from __future__ import annotations

from collections.abc import Callable

from hivejobs import App
from hivejobs.completer import Completer
from hivejobs.records import ClaimedJob, Completion
from hivejobs.store import new_worker_id
from tests.harness import sql


def make(app: App) -> App:
    for name in ("thing", "other"):
        app.job(name)(lambda ctx, payload: None)
    app.store.upsert_job_types([jt.info() for jt in app.types.values()])
    return app


def claim(app: App, ids: list[str], name: str) -> list[ClaimedJob]:
    with app.store.connection() as conn:
        return app.store.claim_queued(ids, new_worker_id(), conn, name=name)


def test_claim_takes_only_the_pools_own_type(make_app: Callable[..., App]) -> None:
    app = make(make_app())
    ids = app.enqueue_many("thing", [{}] * 3)
    assert claim(app, ids, "other") == []
    assert sorted(app.store.foreign_ids(ids, "other")) == sorted((i, "thing") for i in ids)
    assert sorted(j.id for j in claim(app, ids, "thing")) == sorted(ids)
    assert app.store.foreign_ids(ids, "thing") == []


def test_completer_isolates_the_completion_it_cannot_write(
    make_app: Callable[..., App], database_url: str
) -> None:
    """One batch: a completion whose id is already archived, one whose error Postgres could
    not encode, and innocent ones. Every innocent one is written; the archived record wins;
    the bad error is stored escaped."""
    app = make(make_app())
    ids = app.enqueue_many("thing", [{}] * 8)
    jobs = claim(app, ids, "thing")
    clash, odd = ids[2], ids[5]
    sql(
        database_url,
        "INSERT INTO hivejobs_archive (id, name, state, priority, attempt, attempts, delivery,"
        " payload, created_at, run_at, error) SELECT id, name, 'succeeded', priority, attempt,"
        " attempts, delivery, payload, created_at, run_at, 'kept' FROM hivejobs_job"
        " WHERE id = %s",
        (clash,),
    )
    written: list[str] = []
    completer = Completer(app.store, app.broker, lambda done: written.extend(c.id for c in done))
    for job in jobs:
        bad_text = "caf" + b"\xe9".decode("utf-8", "surrogateescape")
        completer.submit(
            Completion(
                id=job.id,
                claim_token=job.claim_token,
                outcome="failed" if job.id == odd else "succeeded",
                error=bad_text if job.id == odd else None,
                result=b'"ok"',
            )
        )
    completer.start()  # after the submits: they form one batch
    assert completer.flush(30.0)
    rows = dict(
        sql(database_url, "SELECT id, state || ' ' || coalesce(error, '') FROM hivejobs_archive")
    )
    assert rows.pop(clash) == "succeeded kept"
    assert rows.pop(odd) == "failed caf\\udce9"
    assert rows == {i: "succeeded " for i in ids if i not in (clash, odd)}
    assert sql(database_url, "SELECT count(*) FROM hivejobs_job")[0][0] == 0
    assert sorted(written) == sorted(ids)  # the pool forgets every claim, the clash too
    assert completer.unwritable == 1
