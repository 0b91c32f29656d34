"""Completions and claims that must not touch other jobs, on real Redis and Postgres."""

from __future__ import annotations

from collections.abc import Callable

from hivejobs import App
from hivejobs.coordinator.rescuer import rescue_isolated
from hivejobs.records.jobs import ClaimedJob, Completion
from hivejobs.store import new_worker_id
from hivejobs.worker.completer import Completer
from tests.harness import sql


def make(app: App) -> App:
    for name in ("thing", "other"):
        app.job(name)(lambda ctx, payload: None)
    app.connections.store.upsert_job_types([jt.info() for jt in app.types.values()])
    return app


def claim(app: App, ids: list[str], name: str) -> list[ClaimedJob]:
    with app.connections.store.connection() as conn:
        return app.connections.store.claim_queued(ids, new_worker_id(), conn, name=name)


def test_claim_takes_only_the_pools_own_type(make_app: Callable[..., App]) -> None:
    app = make(make_app())
    ids = app.enqueue_many("thing", [{}] * 3)
    assert claim(app, ids, "other") == []
    assert sorted(app.connections.store.foreign_ids(ids, "other")) == sorted(
        (i, "thing") for i in ids
    )
    assert sorted(j.id for j in claim(app, ids, "thing")) == sorted(ids)
    assert app.connections.store.foreign_ids(ids, "thing") == []


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
    completer = Completer(
        app.connections.store,
        app.connections.broker,
        lambda done: written.extend(c.id for c in done),
    )
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


def refuse_archiving(database_url: str, job_id: str) -> None:
    """A trigger that makes the archive refuse one id, as a data error (not a lost link)."""
    sql(database_url, "CREATE TABLE refused (id text PRIMARY KEY)")
    sql(database_url, "INSERT INTO refused VALUES (%s)", (job_id,))
    sql(
        database_url,
        "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
        " IF EXISTS (SELECT 1 FROM refused WHERE id = NEW.id) THEN"
        " RAISE EXCEPTION 'refused' USING ERRCODE = 'check_violation'; END IF;"
        " RETURN NEW; END $$",
    )
    sql(
        database_url,
        "CREATE TRIGGER refuse BEFORE INSERT ON hivejobs_archive"
        " FOR EACH ROW EXECUTE FUNCTION refuse()",
    )


def test_completion_that_nothing_can_write_is_let_go(
    make_app: Callable[..., App], database_url: str
) -> None:
    """A job the archive refuses whatever we write: the others of its batch are written, and
    the completer lets go of it (left running for the rescue) instead of retrying for ever."""
    app = make(make_app())
    ids = app.enqueue_many("thing", [{}] * 5)
    jobs = claim(app, ids, "thing")
    refuse_archiving(database_url, ids[1])
    written: list[str] = []
    completer = Completer(
        app.connections.store,
        app.connections.broker,
        lambda done: written.extend(c.id for c in done),
    )
    for job in jobs:
        completer.submit(Completion(id=job.id, claim_token=job.claim_token, outcome="succeeded"))
    completer.start()
    assert completer.flush(30.0)
    archived = {r[0] for r in sql(database_url, "SELECT id FROM hivejobs_archive")}
    assert archived == set(ids) - {ids[1]}
    assert sql(database_url, "SELECT id, state FROM hivejobs_job") == [(ids[1], "running")]
    assert sorted(written) == sorted(ids)
    assert completer.unwritable == 1


def test_rescue_of_one_process_does_not_wait_on_another(
    make_app: Callable[..., App], database_url: str
) -> None:
    """Two dead processes; the archive refuses one's job. The other's job is rescued."""
    app = make(make_app())
    refused, innocent = app.enqueue_many("thing", [{}] * 2)
    dead = [new_worker_id(), new_worker_id()]
    for job_id, worker in ((refused, dead[0]), (innocent, dead[1])):
        sql(
            database_url,
            "UPDATE hivejobs_job SET state = 'running', worker_id = %s, claim_token = 1,"
            " attempt = 1, delivery = 'at_most_once' WHERE id = %s",
            (worker, job_id),
        )
    refuse_archiving(database_url, refused)
    rescued = rescue_isolated(app.connections.store, dead, poison_after=3)
    assert rescued is not None and rescued.failed == 1
    states = dict(sql(database_url, "SELECT id, state FROM hivejobs_job"))
    assert states == {refused: "running"}  # its process's rescue is retried next pass
    assert sql(database_url, "SELECT state, error FROM hivejobs_archive") == [
        ("failed", "worker lost")
    ]
