"""The store's leader-only verbs and its LISTEN session, against real Postgres.

A guarded verb (`..._if_leader`) returns None and writes nothing once its lease is lost; the
listener sorts what it hears into pushes, chain wake-ups and notifications not ours.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import psycopg

from hivejobs import App
from hivejobs.records.dispatch import Lease, Push
from hivejobs.store import new_worker_id
from hivejobs.store.callbacks import CallbackStore
from hivejobs.store.notify import Heard, Listener, dispatch_payloads
from tests.harness import sql, wait_until


def _app(make_app: Callable[..., App]) -> App:
    app = make_app()

    @app.job("thing")
    def thing(ctx: object, payload: dict[str, int]) -> None: ...

    app.connections.store.upsert_job_types([app.types["thing"].info()])
    return app


def _take_over(app: App, database_url: str) -> tuple[Lease, Lease]:
    """(old, new): a lease that expired and was taken by another holder."""
    old_holder, new_holder = new_worker_id(), new_worker_id()
    old_term = app.connections.store.lease_acquire(old_holder, 30.0)
    assert old_term is not None
    sql(database_url, "UPDATE hivejobs_leader SET expires_at = now() - interval '1 second'")
    new_term = app.connections.store.lease_acquire(new_holder, 30.0)
    assert new_term == old_term + 1
    return Lease(old_holder, old_term), Lease(new_holder, new_term)


def test_guarded_verbs_write_nothing_once_the_lease_is_lost(
    make_app: Callable[..., App], database_url: str
) -> None:
    app = _app(make_app)
    due = app.enqueue("thing", {"n": 1}, delay=60.0)
    stale = app.enqueue("thing", {"n": 2})
    expired = app.enqueue("thing", {"n": 3}, delay=60.0)
    sql(database_url, "UPDATE hivejobs_job SET run_at = now() WHERE id = %s", (due,))
    sql(
        database_url,
        "UPDATE hivejobs_job SET expires_at = now() - interval '1 second' WHERE id = %s",
        (expired,),
    )
    sql(
        database_url,
        "UPDATE hivejobs_job SET queued_at = now() - interval '1 minute' WHERE id = %s",
        (stale,),
    )
    old, new = _take_over(app, database_url)

    assert app.connections.store.promote_due_if_leader(old, 100) is None
    assert app.connections.store.end_waiting_if_leader(old, 100) is None
    assert app.connections.store.stale_queued_if_leader(old, ("thing", 0), 2.0, 100) is None
    states = dict(sql(database_url, "SELECT id, state FROM hivejobs_job"))
    assert states == {due: "scheduled", stale: "queued", expired: "scheduled"}
    moved = sql(
        database_url,
        "SELECT queued_at > now() - interval '10 seconds' FROM hivejobs_job WHERE id = %s",
        (stale,),
    )
    assert moved == [(False,)]  # not re-stamped either

    assert app.connections.store.promote_due_if_leader(new, 100) == [Push(due, "thing", 0)]
    assert app.connections.store.stale_queued_if_leader(new, ("thing", 0), 2.0, 100) == [
        Push(stale, "thing", 0)
    ]
    assert app.connections.store.end_waiting_if_leader(new, 100) == 1


def test_sweeps_with_nothing_to_write_take_no_lease_lock(
    make_app: Callable[..., App], database_url: str
) -> None:
    """An idle sweep is one read in autocommit, not a guarded transaction. With
    the lease row locked by another session, the idle sweeps return at once (a guarded
    transaction would wait for that lock); once a job is due, the promoter's pass waits for
    the lock, then promotes under the lease."""
    app = _app(make_app)
    lease = Lease(new_worker_id(), 0)
    term = app.connections.store.lease_acquire(lease.holder, 30.0)
    assert term is not None
    lease = Lease(lease.holder, term)
    callbacks = CallbackStore(app.connections.store)
    with psycopg.connect(database_url) as locker:
        locker.execute("SELECT 1 FROM hivejobs_leader FOR UPDATE")
        idle: list[object] = []
        sweeps = threading.Thread(
            target=lambda: idle.extend(
                [
                    app.connections.store.promote_due_if_leader(lease, 100),
                    app.connections.store.end_waiting_if_leader(lease, 100),
                    callbacks.end_timed_out_if_leader(lease, 100),
                ]
            ),
            daemon=True,
        )
        sweeps.start()
        sweeps.join(10.0)  # a guarded transaction would wait here until the locker ends
        assert idle == [[], 0, ([], [])]

        due = app.enqueue("thing", {"n": 1}, delay=60.0)
        sql(database_url, "UPDATE hivejobs_job SET run_at = now() WHERE id = %s", (due,))
        promoted: list[list[Push] | None] = []
        sweep = threading.Thread(
            target=lambda: promoted.append(app.connections.store.promote_due_if_leader(lease, 100)),
            daemon=True,
        )
        sweep.start()
        wait_until(lambda: _waits_on_a_lock(database_url), 10.0, what="the promotion waiting")
        assert not promoted
        locker.rollback()
    sweep.join(10.0)
    assert promoted == [[Push(due, "thing", 0)]]


def _waits_on_a_lock(database_url: str) -> bool:
    rows = sql(
        database_url,
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND wait_event_type = 'Lock'",
    )
    return bool(rows[0][0])


def _hear(listener: Listener, done: Callable[[Heard], bool], timeout_s: float = 10.0) -> Heard:
    """Everything heard until `done` says it is all there (notifications of one commit may
    come in more than one packet)."""
    heard = Heard()
    deadline = time.monotonic() + timeout_s
    while not done(heard) and time.monotonic() < deadline:
        more = listener.wait(0.5)
        heard.pushes += more.pushes
        heard.chains |= more.chains
        heard.search_chains = heard.search_chains or more.search_chains
        heard.malformed += more.malformed
    return heard


def test_listener_sorts_dispatches_chain_wakeups_and_notes_not_ours(database_url: str) -> None:
    listener = Listener(database_url)
    try:
        assert listener.wait(0.0) == Heard()  # LISTEN is in force from here on
        pushes = [Push("j1", "thing", 0), Push("j2", "thing", 0), Push("j3", "other", 3)]
        with psycopg.connect(database_url) as conn:  # one transaction: delivered on commit
            for payload in dispatch_payloads(pushes):
                conn.execute("SELECT pg_notify('hivejobs_dispatch', %s)", (payload,))
            conn.execute("SELECT pg_notify('hivejobs_chain', 'c1,c2')")
            conn.execute("SELECT pg_notify('hivejobs_chain', '')")
            conn.execute("SELECT pg_notify('hivejobs_dispatch', 'not a dispatch')")

        heard = _hear(listener, lambda h: len(h.pushes) == 3 and bool(h.malformed))
        assert sorted(heard.pushes) == sorted(pushes)
        assert heard.chains == {"c1", "c2"}
        assert heard.search_chains
        assert [m.payload for m in heard.malformed] == ["not a dispatch"]
    finally:
        listener.close()
