"""The prune of idle sequence counters (hivejobs_sequence) on real Postgres: which keys lose
their row, and an enqueue racing the prune in both orders keeps every key in order (a key's
number restarts only when nothing of it is live).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import psycopg

from hivejobs import App
from hivejobs.coordinator.pruner import Pruner
from hivejobs.records.jobs import ClaimedJob, Completion, Outcome
from hivejobs.store import new_worker_id
from hivejobs.store.sequence import SequenceStore
from tests.harness import sql, wait_until

COUNTERS = "SELECT key, last_seq FROM hivejobs_sequence ORDER BY key"
SEQ_OF = "SELECT seq FROM hivejobs_job WHERE id = %s"
AGE = "UPDATE hivejobs_sequence SET used_at = now() - interval '2 hours'"
WAITING_ON_A_LOCK = (
    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
    " AND wait_event_type = 'Lock'"
)


def make(app: App) -> App:
    app.job("step", sequence_by="account")(lambda ctx, payload: None)
    app.connections.store.upsert_job_types([jt.info() for jt in app.types.values()])
    return app


def claim(app: App, ids: list[str]) -> list[ClaimedJob]:
    with app.connections.store.connection() as conn:
        return app.connections.store.claim_queued(
            ids, new_worker_id(), conn, name="step", sequenced=True
        )


def run_out(app: App, job_id: str, name: str = "step", outcome: Outcome = "succeeded") -> None:
    """Claim and end one job, as a pool does."""
    with app.connections.store.connection() as conn:
        (job,) = app.connections.store.claim_queued([job_id], new_worker_id(), conn, name=name,
                                        sequenced=True)  # fmt: skip
        done = Completion(id=job.id, claim_token=job.claim_token, outcome=outcome)
        app.connections.store.finish([done], conn)


def test_only_idle_keys_lose_their_counter(make_app: Callable[..., App], database_url: str) -> None:
    """Idle past the retention with nothing live and no hold: dropped. A key with a live
    job, a held key and a key used within the retention keep their rows."""
    app = make(make_app())
    app.job("held_step", sequence_by="account")(lambda ctx, payload: None)
    idle, live = app.enqueue("step", {"account": "idle"}), app.enqueue("step", {"account": "live"})
    held = app.enqueue("held_step", {"account": "held"})
    run_out(app, idle)
    run_out(app, held, "held_step", "failed")  # on_failure="hold": the key is held
    sql(database_url, AGE)
    recent = app.enqueue("step", {"account": "recent"})
    run_out(app, recent)
    assert sql(database_url, "SELECT state FROM hivejobs_job WHERE id = %s", (live,)) == [
        ("queued",)
    ]
    assert Pruner(app.connections.store, retention_s=3600.0).prune(lambda: True).idle_keys == 1
    assert [r[0] for r in sql(database_url, COUNTERS)] == ['"held"', '"live"', '"recent"']
    assert (
        Pruner(app.connections.store, retention_s=0.0).prune(lambda: True).idle_keys == 1
    )  # recent
    assert [r[0] for r in sql(database_url, COUNTERS)] == ['"held"', '"live"']


def test_an_enqueue_holding_the_counter_keeps_it_and_the_key_numbers_on(
    make_app: Callable[..., App], database_url: str
) -> None:
    """An enqueue inside a caller's transaction holds its key's counter until its commit: the
    prune (retention 0) passes over it without waiting, and after the commit the key has a
    live job, so it keeps its row and its numbers go on."""
    app = make(make_app())
    first = app.enqueue("step", {"account": "a"})
    run_out(app, first)
    sequences = SequenceStore(app.connections.store)
    with psycopg.connect(database_url, autocommit=True) as caller:
        with caller.transaction():
            second = app.enqueue("step", {"account": "a"}, conn=caller)
            pruned: list[int] = []
            prune = threading.Thread(target=lambda: pruned.append(sequences.prune_idle(0.0)))
            prune.start()
            wait_until(lambda: not prune.is_alive(), what="the prune, which must not wait")
            assert pruned == [0]
    assert sequences.prune_idle(0.0) == 0  # the key's job is live now
    third = app.enqueue("step", {"account": "a"})
    seqs = [sql(database_url, SEQ_OF, (i,))[0][0] for i in (second, third)]
    assert seqs == [2, 3]
    assert [j.id for j in claim(app, [third, second])] == [second]


def test_an_enqueue_waiting_for_the_prune_numbers_its_key_from_one(
    make_app: Callable[..., App], database_url: str
) -> None:
    """The prune holds an idle key's counter when an enqueue of that key comes: the enqueue
    waits, the prune drops the row, and the job starts the key again at 1, which is safe
    since nothing of the key is live; the jobs after it follow it."""
    app = make(make_app())
    first = app.enqueue("step", {"account": "a"})
    run_out(app, first)
    sequences = SequenceStore(app.connections.store)
    pruned: list[int] = []
    got: list[str] = []
    with psycopg.connect(database_url, autocommit=True) as blocker:
        with blocker.transaction():
            # The prune's DELETE waits for this lock after its SELECT ... FOR UPDATE has
            # locked the row (SHARE lets row locks through, not row changes).
            blocker.execute("LOCK TABLE hivejobs_sequence IN SHARE MODE")
            prune = threading.Thread(target=lambda: pruned.append(sequences.prune_idle(0.0)))
            prune.start()
            wait_until(lambda: sql(database_url, WAITING_ON_A_LOCK)[0][0] == 1, what="prune")
            enqueue = threading.Thread(
                target=lambda: got.append(app.enqueue("step", {"account": "a"}))
            )
            enqueue.start()
            wait_until(lambda: sql(database_url, WAITING_ON_A_LOCK)[0][0] == 2, what="enqueue")
        prune.join(30)
        enqueue.join(30)
    assert pruned == [1]
    later = app.enqueue("step", {"account": "a"})
    assert [sql(database_url, SEQ_OF, (i,))[0][0] for i in (got[0], later)] == [1, 2]
    assert [j.id for j in claim(app, [later, got[0]])] == [got[0]]
