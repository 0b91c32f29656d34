"""Sequences per key, statement by statement on real Postgres: the numbering at enqueue, the
claim guard (one job of a key running, in order, not while held), the parking of refused
ids and the hand-over trigger (hold, continue, release, replay), bad input at the edge.

Each test builds the state with the App's own calls, claims with the store's sequenced claim
as a pool does, writes completions as the completer does, and reads the rows.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import psycopg
import pytest

from hivejobs import App
from hivejobs.coordinator.gauges import Gauges
from hivejobs.coordinator.sequencer import Sequencer
from hivejobs.errors import ChainInvalid, InvalidJobType, PayloadInvalid
from hivejobs.flow import Flow
from hivejobs.records.jobs import ClaimedJob, Completion, Outcome
from hivejobs.store import new_worker_id
from hivejobs.worker.completer import Completer
from tests.harness import sql, wait_until


def make(app: App, on_failure: str = "hold", attempts: int = 1) -> App:
    app.job("step", attempts=attempts, sequence_by="account", on_failure=on_failure)(
        lambda ctx, payload: None
    )
    app.connections.store.upsert_job_types([jt.info() for jt in app.types.values()])
    return app


def claim(app: App, ids: list[str]) -> list[ClaimedJob]:
    with app.connections.store.connection() as conn:
        return app.connections.store.claim_queued(
            ids, new_worker_id(), conn, name="step", sequenced=True
        )


def finish(app: App, job: ClaimedJob, outcome: Outcome, delay_s: float = 0.0) -> None:
    done = Completion(
        id=job.id, claim_token=job.claim_token, outcome=outcome, error="boom",
        retry_delay_s=delay_s,
    )  # fmt: skip
    with app.connections.store.connection() as conn:
        assert app.connections.store.finish([done], conn)[0] == 1


def queued_at_set(database_url: str, job_id: str) -> bool:
    rows = sql(
        database_url, "SELECT queued_at IS NOT NULL FROM hivejobs_job WHERE id = %s", (job_id,)
    )
    return bool(rows[0][0])


def enqueue_line(app: App, account: str, n: int) -> list[str]:
    return [app.enqueue("step", {"account": account, "i": i}) for i in range(n)]


def test_a_key_runs_one_job_at_a_time_in_enqueue_order(
    make_app: Callable[..., App], database_url: str
) -> None:
    """Every id of two keys popped at once, in reverse order: only each key's first starts;
    the rest are parked; each completion hands its key to the next, in order."""
    app = make(make_app())
    a, b = enqueue_line(app, "a", 3), enqueue_line(app, "b", 2)
    got = claim(app, list(reversed(a + b)))
    assert sorted(j.id for j in got) == sorted([a[0], b[0]])
    assert not any(queued_at_set(database_url, i) for i in a[1:] + b[1:])  # parked
    assert claim(app, a[1:] + b[1:]) == []  # a key with a running job starts nothing
    ran = [a[0]]
    current = next(j for j in got if j.id == a[0])
    for nxt in a[1:]:
        finish(app, current, "succeeded")
        assert queued_at_set(database_url, nxt)  # handed over: dispatched again
        later = [i for i in a if i not in ran and i != nxt]
        (current,) = claim(app, later + [nxt])  # only the next one, whatever came first
        assert current.id == nxt
        ran.append(nxt)
    assert ran == a


def test_a_later_job_never_starts_while_an_earlier_one_is_live(
    make_app: Callable[..., App], database_url: str
) -> None:
    """The first job scheduled for later (a delay) or waiting for its retry keeps its key:
    the second waits for it, whatever Redis hands out."""
    app = make(make_app(), attempts=3)
    first = app.enqueue("step", {"account": "a"}, delay=3600)
    second = app.enqueue("step", {"account": "a"})
    assert claim(app, [second]) == []
    sql(
        database_url,
        "UPDATE hivejobs_job SET state = 'queued', queued_at = now() WHERE id = %s",
        (first,),
    )
    (job,) = claim(app, [first, second])
    assert job.id == first
    finish(app, job, "retry", delay_s=3600)  # attempts left: the key waits for the retry
    assert claim(app, [second]) == []
    assert not queued_at_set(database_url, second)


@pytest.mark.parametrize("on_failure", ["hold", "continue"])
def test_a_job_failed_for_good_holds_or_releases_its_key(
    make_app: Callable[..., App], database_url: str, on_failure: str
) -> None:
    app = make(make_app(), on_failure=on_failure)
    first, second = enqueue_line(app, "a", 2)
    (job,) = claim(app, [first, second])
    finish(app, job, "failed")
    keys = app.keys("step")
    if on_failure == "hold":
        assert claim(app, [second]) == []
        assert [(k.key, k.held_by, k.held_error, k.next_id) for k in keys] == [
            ('"a"', first, "boom", second)
        ]
        assert app.release_key("step", '"a"') == first
        assert queued_at_set(database_url, second)
    else:
        assert [k.held_by for k in keys] == [None]
    assert [j.id for j in claim(app, [second])] == [second]


def test_the_replay_of_the_held_job_runs_first_then_the_key_goes_on(
    make_app: Callable[..., App], database_url: str
) -> None:
    app = make(make_app())
    first, second = enqueue_line(app, "a", 2)
    (job,) = claim(app, [first])
    finish(app, job, "failed")
    assert claim(app, [second]) == []  # parked behind the hold
    replay = app.replay(first)
    assert claim(app, [second]) == []  # the replay's turn, not the second's
    (again,) = claim(app, [replay, second])
    assert again.id == replay
    finish(app, again, "succeeded")
    assert [j.id for j in claim(app, [second])] == [second]
    assert app.keys("step") and app.keys("step")[0].held_by is None


def test_a_cancelled_or_expired_next_job_hands_the_key_on(
    make_app: Callable[..., App], database_url: str
) -> None:
    app = make(make_app())
    first, second, third = enqueue_line(app, "a", 3)
    (job,) = claim(app, [first, second, third])
    app.cancel(second)
    finish(app, job, "succeeded")
    assert queued_at_set(database_url, third)
    assert [j.id for j in claim(app, [third])] == [third]


def test_the_completion_that_ends_a_key_pushes_the_job_it_handed_the_key_to(
    make_app: Callable[..., App], database_url: str
) -> None:
    """The completer pushes the job the hand-over unparked in its own transaction (no NOTIFY
    needed); not a next job that was never parked (pushed at enqueue, still in Redis), nor
    one behind a hold."""
    app = make(make_app())
    a, b, c = enqueue_line(app, "a", 2), enqueue_line(app, "b", 2), enqueue_line(app, "c", 2)
    jobs = {j.id: j for j in claim(app, [a[0], a[1], b[0], c[0], c[1]])}  # b[1] not popped
    assert not queued_at_set(database_url, a[1]) and not queued_at_set(database_url, c[1])
    app.flush()
    app.connections.broker.redis.delete(
        *app.connections.broker.redis.keys(app.connections.broker.queue_keys_glob("step"))
    )
    completer = Completer(app.connections.store, app.connections.broker)
    ends: list[tuple[str, Outcome]] = [(a[0], "succeeded"), (b[0], "succeeded"), (c[0], "failed")]
    for job_id, outcome in ends:
        job = jobs[job_id]
        completer.submit(Completion(id=job.id, claim_token=job.claim_token, outcome=outcome))
    completer.start()  # after the submits: they form one batch
    assert completer.flush(30.0)
    assert app.connections.broker.pop("step", 10).ids == [a[1]]
    assert sorted(j.id for j in claim(app, [a[1], b[1], c[1]])) == sorted([a[1], b[1]])
    assert not queued_at_set(database_url, c[1])  # held by c[0]


def test_the_guard_holds_without_the_park_and_the_hand_over(
    make_app: Callable[..., App], database_url: str
) -> None:
    """Redis dispatch is a hint: even an id pushed when it should not be (parking undone by
    hand) is refused while its key runs a job or an earlier one is live."""
    app = make(make_app())
    first, second = enqueue_line(app, "a", 2)
    (job,) = claim(app, [first])
    sql(database_url, "UPDATE hivejobs_job SET queued_at = now() WHERE id = %s", (second,))
    assert claim(app, [second]) == []
    finish(app, job, "succeeded")
    assert [j.id for j in claim(app, [second])] == [second]


def test_a_job_numbered_first_still_waits_for_the_running_one(
    make_app: Callable[..., App], database_url: str
) -> None:
    """One job of a key at a time even against the numbering: a job put before the running
    one (by hand here; a replay taking a held job's place is the one way it happens) waits."""
    app = make(make_app())
    first, second = enqueue_line(app, "a", 2)
    (job,) = claim(app, [first])
    sql(database_url, "UPDATE hivejobs_job SET seq = 0 WHERE id = %s", (second,))
    assert claim(app, [second]) == []
    finish(app, job, "succeeded")
    assert [j.id for j in claim(app, [second])] == [second]


WAITING_KEY_LOCK = (
    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = 1936027953"
    " AND NOT granted"
)


def test_a_hand_over_waits_for_a_claim_that_parks_the_next_job(
    make_app: Callable[..., App], database_url: str
) -> None:
    """A claim parks the second job (the first still runs) while the first one's completion
    hands the key over: the hand-over waits for the claim's key lock, then unparks the
    second. Without the lock the hand-over would see it unparked, do nothing, and the park
    committed after would leave it out of Redis for good."""
    app = make(make_app())
    first, second = enqueue_line(app, "a", 2)
    (job,) = claim(app, [first])
    with psycopg.connect(database_url, autocommit=True) as other:
        with other.transaction():
            got = app.connections.store.claim_queued(
                [second], new_worker_id(), other, name="step", sequenced=True
            )
            assert got == []  # parked, not yet committed
            done = threading.Thread(target=finish, args=(app, job, "succeeded"))
            done.start()
            wait_until(
                lambda: sql(database_url, WAITING_KEY_LOCK)[0][0] == 1 or not done.is_alive(),
                what="the hand-over waiting for the claim's key lock",
            )
        done.join(30)
    assert queued_at_set(database_url, second)
    assert [j.id for j in claim(app, [second])] == [second]


def test_enqueue_numbers_a_key_in_order_also_in_bulk(
    make_app: Callable[..., App], database_url: str
) -> None:
    app = make(make_app())
    one = app.enqueue("step", {"account": "a"})
    many = app.enqueue_many("step", [{"account": k} for k in ["a", "b", "a", "a", "b"]])
    rows = dict(sql(database_url, "SELECT id, seq FROM hivejobs_job"))
    a_ids = [one] + [many[i] for i in (0, 2, 3)]
    assert [rows[i] for i in a_ids] == sorted(rows[i] for i in a_ids)
    assert len({rows[i] for i in a_ids}) == 4
    assert rows[many[1]] < rows[many[4]]


def test_bad_input_is_refused_before_anything_is_stored(
    make_app: Callable[..., App], database_url: str
) -> None:
    app = make(make_app())
    with pytest.raises(PayloadInvalid, match="no 'account' field"):
        app.enqueue("step", {"acount": "a"})
    with pytest.raises(PayloadInvalid, match="no 'account' field"):
        app.enqueue_many("step", [{"account": "a"}, {"other": 1}])
    with pytest.raises(PayloadInvalid, match="JSON object"):
        app.enqueue("step", [1, 2])
    assert sql(database_url, "SELECT count(*) FROM hivejobs_job")[0][0] == 0
    assert sql(database_url, "SELECT count(*) FROM hivejobs_sequence")[0][0] == 0
    with pytest.raises(InvalidJobType, match="on_failure must be 'hold' or 'continue'"):
        app.job("x", sequence_by="account", on_failure="skip")
    with pytest.raises(InvalidJobType, match="on_failure needs sequence_by"):
        app.job("y", on_failure="hold")
    with pytest.raises(InvalidJobType, match="sequence_by must be the name"):
        app.job("z", sequence_by="")
    from hivejobs import Chain

    chain = Chain("c")
    chain.job("step", {"acount": "a"}, key="post")
    with pytest.raises(ChainInvalid, match="job 'post': .*no 'account' field"):
        app.run_chain(chain)
    assert sql(database_url, "SELECT count(*) FROM hivejobs_chain")[0][0] == 0


def test_with_limit_by_and_pause_through_the_pools_flow(
    make_app: Callable[..., App], database_url: str
) -> None:
    """The pool's own path (Flow.claim, Flow.put_back) for a type with both limit_by and
    sequence_by: the limited claim's lock, then the keys' guard inside it."""
    app = make_app()
    app.job("both", global_concurrency=1, limit_by="tenant", sequence_by="account")(
        lambda ctx, payload: None
    )
    jt = app.types["both"]
    app.connections.store.upsert_job_types([jt.info()])
    flow = Flow(app.connections.store, app.connections.broker, "both", jt.limits, sequenced=True)
    a = [app.enqueue("both", {"tenant": "t1", "account": "a", "i": i}) for i in range(2)]
    b = app.enqueue("both", {"tenant": "t1", "account": "b"})  # same tenant: its one slot
    c = app.enqueue("both", {"tenant": "t2", "account": "c"})
    app.flush()
    assert app.pause("both")
    popped = app.connections.broker.pop("both", 10)
    with app.connections.store.connection() as conn:
        assert flow.claim(conn, popped.ids, new_worker_id()) == []
    flow.put_back(popped, [])  # paused: nothing judged, everything back
    assert sorted(app.connections.broker.pop("both", 10).ids) == sorted([*a, b, c])
    app.resume("both")
    with app.connections.store.connection() as conn:
        got = flow.claim(conn, [a[1], b, a[0], c], new_worker_id())
    # limit_by offers t1's one slot to the first t1 id popped, a[1]; the sequence refuses it
    # (a[0] comes first) and parks it; the slot stays free for the next claim.
    assert [j.id for j in got] == [c]
    assert not queued_at_set(database_url, a[1])
    with app.connections.store.connection() as conn:
        assert [j.id for j in flow.claim(conn, [a[0], b], new_worker_id())] == [a[0]]
        assert flow.claim(conn, [b], new_worker_id()) == []  # t1's slot is a[0]'s now


def test_the_sequencer_hands_over_a_key_left_parked_and_only_such_keys(
    make_app: Callable[..., App], database_url: str
) -> None:
    """A key whose next job is parked with nothing ahead (made by hand: no path should
    leave one) is handed over by the coordinator's repair pass and pushed; a held key and
    a key with a running job are left as they are."""
    app = make(make_app())
    stalled = enqueue_line(app, "a", 2)
    running = enqueue_line(app, "b", 2)
    held = enqueue_line(app, "c", 2)
    jobs = {j.id: j for j in claim(app, [stalled[0], running[0], held[0]])}
    finish(app, jobs[stalled[0]], "succeeded")
    finish(app, jobs[held[0]], "failed")
    claim(app, [running[1], held[1]])  # parked behind the running job and the hold
    park = "UPDATE hivejobs_job SET queued_at = NULL WHERE id = %s"
    sql(database_url, park, (stalled[1],))  # as if a hand-over had been missed
    app.flush()
    app.connections.broker.redis.delete(
        *app.connections.broker.redis.keys(app.connections.broker.queue_keys_glob("step"))
    )

    assert Sequencer(app.connections.store, app.connections.broker).run_once() == 1
    assert queued_at_set(database_url, stalled[1])
    assert app.connections.broker.pop("step", 10).ids == [stalled[1]]
    assert not queued_at_set(database_url, running[1])
    assert not queued_at_set(database_url, held[1])
    assert Sequencer(app.connections.store, app.connections.broker).run_once() == 0


def test_the_queue_depth_gauge_counts_jobs_parked_behind_their_key(
    make_app: Callable[..., App], database_url: str
) -> None:
    app = make(make_app())
    line = enqueue_line(app, "a", 3)
    claim(app, line)  # the first runs, two are parked (out of Redis)
    assert Gauges(app.connections.store).run_once() == {"queued": 2, "running": 1}
    gauge = "SELECT value FROM hivejobs_gauge WHERE name = 'queued' AND queue = 'step'"
    assert sql(database_url, gauge) == [(2,)]


def test_a_pools_completion_hands_over_without_a_notify_other_endings_with_one(
    make_app: Callable[..., App], database_url: str
) -> None:
    """The completer pushes what its batch's hand-over unparked, so the trigger sends no
    NOTIFY for it (the coordinator would push it a second time); a hand-over on another
    path (here a release) still sends one. Notifications arrive in commit order, so the
    release's coming alone proves the completion's never came."""
    app = make(make_app())
    a, b = enqueue_line(app, "a", 2), enqueue_line(app, "b", 2)
    jobs = {j.id: j for j in claim(app, [a[0], a[1], b[0], b[1]])}
    with psycopg.connect(database_url, autocommit=True) as listener:
        listener.execute("LISTEN hivejobs_dispatch")
        finish(app, jobs[a[0]], "succeeded")
        assert queued_at_set(database_url, a[1])
        finish(app, jobs[b[0]], "failed")  # holds b
        assert app.release_key("step", '"b"') == b[0]
        notes = list(listener.notifies(timeout=30, stop_after=1))
    assert [n.payload.split("\t")[-1] for n in notes] == [b[1]]
