"""Fair dispatch (broker/fair.py) against real Redis and Postgres: the ring's order, weights,
priority within a key, the reconciler's view of per-key lists, and bad input at enqueue."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from hivejobs import App
from hivejobs.broker.fair import FairQueue, list_prefix, ring_key
from hivejobs.coordinator.reconciler import FAIR_PAGE, Reconciler
from hivejobs.errors import InvalidJobType, PayloadInvalid
from hivejobs.store.fair import FairStore
from tests.harness import sql, wait_until
from tests.integration.test_coordinator import leader


def fair_app(
    make_app: Callable[..., App], weights: dict[str | int, int] | None = None, **settings: float
) -> App:
    app = make_app(**settings)

    @app.job("billing", fair_by="customer", fair_weights=weights)
    def billing(ctx: object, payload: dict[str, Any]) -> None: ...

    app.connections.store.upsert_job_types([app.types["billing"].info()])
    app.connections.broker.set_boot_marker("x")  # not a flushed Redis
    return app


def queue_of(app: App) -> tuple[FairQueue, FairStore]:
    jt = app.types["billing"]
    assert jt.fair is not None
    return FairQueue(app.connections.broker, "billing", jt.fair.weights), FairStore(
        app.connections.store, "billing", jt.fair.field
    )


def pop_all(app: App, count: int) -> list[list[str]]:
    queue, store = queue_of(app)
    pops: list[list[str]] = []
    while ids := queue.pop(count, store.keys_of).ids:
        pops.append(ids)
    return pops


def enqueue(app: App, customer: str | int, n: int, **options: Any) -> list[str]:
    ids = [app.enqueue("billing", {"customer": customer, "i": i}, **options) for i in range(n)]
    assert app.flush()
    return ids


def test_a_key_behind_a_backlog_gets_its_turn_in_the_next_round(
    make_app: Callable[..., App],
) -> None:
    """A's 40 jobs were placed in A's list at enqueue (enqueue_many knows their keys); B's
    and C's 3 each, enqueued one by one, wait in the inbox until the first pop (A alone: the
    whole pop) sorts them. From the second pop on each key gets one job per turn, a pop of 2
    taking the next two keys of the ring, and each key keeps its own order."""
    app = fair_app(make_app)
    a = app.enqueue_many("billing", [{"customer": "a", "i": i} for i in range(40)])
    b, c = enqueue(app, "b", 3), enqueue(app, 7, 3)
    assert app.flush()
    popped = [i for ids in pop_all(app, 2) for i in ids]
    turns = [a[2], b[0], c[0], a[3], b[1], c[1], a[4], b[2], c[2], a[5]]
    assert popped[:12] == [*a[:2], *turns]
    assert popped[12:] == a[6:]
    assert (
        app.connections.broker.redis.zcard(ring_key(app.connections.broker.prefix, "billing")) == 0
    )  # all left


def test_weights_give_a_key_that_many_jobs_per_turn(make_app: Callable[..., App]) -> None:
    """Weight 3 for "big": 3 of its jobs per turn of one of "small", whatever the pop size
    (a turn that a pop cuts short goes on at the next pop)."""
    app = fair_app(make_app, weights={"big": 3})
    big, small = enqueue(app, "big", 12), enqueue(app, "small", 4)
    popped = [i for ids in pop_all(app, 2) for i in ids]
    assert popped == [
        *big[0:3],
        small[0],
        *big[3:6],
        small[1],
        *big[6:9],
        small[2],
        *big[9:12],
        small[3],
    ]


def test_within_a_key_priority_comes_before_enqueue_order(make_app: Callable[..., App]) -> None:
    app = fair_app(make_app)
    late = enqueue(app, "a", 2, priority=5)
    urgent = enqueue(app, "a", 2, priority=0)
    assert [i for ids in pop_all(app, 1) for i in ids] == [*urgent, *late]


def test_ids_no_longer_queued_are_not_placed(make_app: Callable[..., App]) -> None:
    """A duplicate push (the reconciler's, a retry's) and an id whose job was cancelled are
    dropped by the sorter: Postgres says which ids are live."""
    app = fair_app(make_app)
    ids = enqueue(app, "a", 3)
    app.connections.broker.push("billing", 0, [ids[0], "no-such-job"])  # a duplicate and garbage
    assert app.cancel(ids[1])
    assert [i for p in pop_all(app, 10) for i in p] == [ids[0], ids[2]]


def test_the_reconciler_counts_per_key_lists_as_held(
    make_app: Callable[..., App], database_url: str
) -> None:
    """Sorted ids sit in per-key lists, not in the inbox: the reconciler must not take them
    for lost (a re-push of the whole backlog every pass). An id that is in no list (a sorter
    or pool that died holding it) is pushed again once every list's head is past it."""
    app = fair_app(make_app)
    lost = enqueue(app, "a", 1)[0]
    held = enqueue(app, "a", 5) + enqueue(app, "b", 5)
    queue, store = queue_of(app)
    assert queue.sort(store.keys_of) == 11
    app.connections.broker.redis.lrem(
        f"{list_prefix(app.connections.broker.prefix, 'billing')}0:a", 0, lost
    )
    sql(database_url, "UPDATE hivejobs_job SET queued_at = now() - interval '10 seconds'")
    sql(
        database_url,
        "UPDATE hivejobs_job SET queued_at = now() - interval '1 minute' WHERE id = %s",
        (lost,),
    )
    reconciler = Reconciler(app.connections.store, app.connections.broker)
    assert reconciler.run_once(leader(app)).pushed == 1  # the lost one, not the 10 held
    assert reconciler.run_once(leader(app)).pushed == 0
    popped = [i for p in pop_all(app, 4) for i in p]
    assert sorted(popped) == sorted([lost, *held])


def test_a_lost_ring_is_repaired_from_postgres(
    make_app: Callable[..., App], database_url: str
) -> None:
    """The ring and a key's list evicted: the reconciler pushes the ids again; nothing lost.
    B's list outlived the ring, so B's ids come out twice (the claim fences the copy)."""
    app = fair_app(make_app)
    ids = enqueue(app, "a", 3) + enqueue(app, "b", 3)
    queue, store = queue_of(app)
    queue.sort(store.keys_of)
    prefix = app.connections.broker.prefix
    app.connections.broker.redis.delete(
        ring_key(prefix, "billing"), f"{list_prefix(prefix, 'billing')}0:a"
    )
    sql(database_url, "UPDATE hivejobs_job SET queued_at = now() - interval '1 minute'")
    assert (
        Reconciler(app.connections.store, app.connections.broker).run_once(leader(app)).pushed == 6
    )
    popped = [i for p in pop_all(app, 10) for i in p]
    assert set(popped) == set(ids)
    assert len(popped) == 9


def test_a_lost_id_is_found_by_its_own_key_while_an_older_backlog_waits(
    make_app: Callable[..., App], database_url: str
) -> None:
    """Each key's list is in queue order, so the rule holds key by key: B's id that no list
    holds is found though A's older backlog still waits ahead of it; A's held ids are not
    pushed again."""
    app = fair_app(make_app)
    a = enqueue(app, "a", 5)
    lost, *b = enqueue(app, "b", 3)
    queue, store = queue_of(app)
    assert queue.sort(store.keys_of) == 8
    app.connections.broker.redis.lrem(
        f"{list_prefix(app.connections.broker.prefix, 'billing')}0:b", 0, lost
    )
    ages = [(a, "1 minute"), ([lost], "30 seconds"), (b, "10 seconds")]
    for ids, age in ages:
        sql(
            database_url,
            "UPDATE hivejobs_job SET queued_at = now() - %s::interval WHERE id = ANY(%s)",
            (age, ids),
        )
    reconciler = Reconciler(app.connections.store, app.connections.broker)
    assert reconciler.run_once(leader(app)).pushed == 1
    assert sorted(i for p in pop_all(app, 10) for i in p) == sorted([*a, lost, *b])


def test_ids_waiting_unsorted_in_the_inbox_are_held(
    make_app: Callable[..., App], database_url: str
) -> None:
    """Ids enqueued one by one wait in the inbox until a pool sorts them: in no key's list
    yet, but not lost."""
    app = fair_app(make_app)
    ids = enqueue(app, "a", 3) + enqueue(app, "b", 3)
    sql(database_url, "UPDATE hivejobs_job SET queued_at = now() - interval '1 minute'")
    assert (
        Reconciler(app.connections.store, app.connections.broker).run_once(leader(app)).pushed == 0
    )
    assert sorted(i for p in pop_all(app, 10) for i in p) == sorted(ids)


def test_a_lost_ring_of_many_keys_is_repaired_in_one_pass(
    make_app: Callable[..., App], database_url: str
) -> None:
    """A pass reads a page of the oldest rows, and the next page while a whole page was lost:
    with the ring gone, every key's ids are pushed again at once, not a page per pass."""
    app = fair_app(make_app)
    keys = 3 * FAIR_PAGE
    ids = app.enqueue_many("billing", [{"customer": f"k{i}"} for i in range(keys)])
    app.connections.broker.redis.delete(ring_key(app.connections.broker.prefix, "billing"))
    sql(database_url, "UPDATE hivejobs_job SET queued_at = now() - interval '1 minute'")
    reconciler = Reconciler(app.connections.store, app.connections.broker)
    assert reconciler.run_once(leader(app)).pushed == keys
    assert reconciler.run_once(leader(app)).pushed == 0
    assert set(i for p in pop_all(app, 50) for i in p) == set(ids)


def test_a_pool_waiting_on_an_empty_type_wakes_for_jobs_placed_by_enqueue_many(
    make_app: Callable[..., App],
) -> None:
    """enqueue_many places its jobs in their keys' lists, not in the inbox a waiting pool
    blocks on: its placement pushes a token that ends the wait (else the pool would see them
    only when its 20 s wait ran out)."""
    app = fair_app(make_app, pop_block_s=20.0, redis_socket_timeout_s=30.0)
    queue, store = queue_of(app)
    popped: list[str] = []
    before = blocked_pops(app)
    waiting = threading.Thread(target=lambda: popped.extend(queue.pop(5, store.keys_of).ids))
    waiting.start()
    wait_until(lambda: blocked_pops(app) - before, what="the pool's pop waiting")
    ids = app.enqueue_many("billing", [{"customer": "a"}, {"customer": "b"}])
    waiting.join(10.0)
    assert not waiting.is_alive(), "the waiting pop was not woken"
    assert sorted(popped) == sorted(ids)


def blocked_pops(app: App) -> set[str]:
    """The Redis clients blocked in a BLMPOP now (the shared Redis may have others': the set
    taken before the pop starts is left out)."""
    clients = app.connections.broker.redis.client_list()
    return {c["id"] for c in clients if c.get("cmd") == "blmpop" and c.get("flags") == "b"}


@pytest.mark.parametrize(
    ("payload", "detail"),
    [
        ({"i": 1}, "the payload has no 'customer' field (fair_by)"),
        ({"customer": None}, "'customer' field (fair_by) must be a string or an integer"),
        ({"customer": 1.5}, "'customer' field (fair_by) must be a string or an integer"),
        ({"customer": "x" * 201}, "'customer' field (fair_by) is longer than 200 characters"),
    ],
)
def test_a_payload_without_a_usable_key_is_refused_and_nothing_stored(
    make_app: Callable[..., App], database_url: str, payload: object, detail: str
) -> None:
    app = fair_app(make_app)
    with pytest.raises(PayloadInvalid, match="customer") as err:
        app.enqueue("billing", payload)
    assert detail in str(err.value)
    with pytest.raises(PayloadInvalid):
        app.enqueue_many("billing", [{"customer": "a"}, payload])
    assert sql(database_url, "SELECT count(*) FROM hivejobs_job") == [(0,)]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"fair_weights": {"a": 2}}, "fair_weights needs fair_by"),
        ({"fair_by": ""}, "fair_by must be the name of a payload field"),
        ({"fair_by": "c", "fair_weights": {"a": 0}}, "fair_weights['a'] must be a whole number"),
        ({"fair_by": "c", "fair_weights": {"a": True}}, "must be a whole number"),
        ({"fair_by": "c", "fair_weights": [("a", 1)]}, "fair_weights must be a dict"),
    ],
)
def test_bad_fair_options_fail_at_declaration(
    make_app: Callable[..., App], options: dict[str, Any], message: str
) -> None:
    app = make_app()
    with pytest.raises(InvalidJobType) as err:
        app.job("billing", **options)
    assert message in str(err.value)
