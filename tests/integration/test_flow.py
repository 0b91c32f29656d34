"""Flow control on real Postgres and Redis: the claim under a pause or a limit,
racing claimers, and the pause API's edges."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from hivejobs import App, Chain, ChainInvalid, PayloadInvalid, UnknownJobType
from hivejobs.flow import SLOT_POLL_S, Flow, Limits
from hivejobs.records.jobs import ClaimedJob, Completion
from hivejobs.store import new_worker_id
from hivejobs.store.flow import FlowState, FlowStore, Room
from tests.harness import sql


def make(app: App) -> App:
    app.job("thing")(lambda ctx, payload: None)
    app.job("capped", global_concurrency=3)(lambda ctx, payload: None)
    app.connections.store.upsert_job_types([jt.info() for jt in app.types.values()])
    return app


def claim(app: App, flow: Flow, ids: list[str]) -> list[ClaimedJob]:
    with app.connections.store.connection() as conn:
        return flow.claim(conn, ids, new_worker_id())


def test_a_paused_type_claims_nothing_and_its_ids_go_back(
    make_app: Callable[..., App], database_url: str
) -> None:
    app = make(make_app())
    flow = Flow(app.connections.store, app.connections.broker, "thing", None)
    ids = app.enqueue_many("thing", [{}] * 4)
    app.flush()
    assert app.pause("thing") is True
    assert app.pause("thing") is False  # already paused
    assert app.paused() == ["thing"]
    popped = app.connections.broker.pop("thing", 4)
    assert claim(app, flow, popped.ids) == []
    flow.put_back(popped, [])
    assert app.connections.broker.pop("thing", 10).ids == popped.ids  # back at the head, in order
    assert flow.room(8).allowed == 0  # and the pool now waits without popping
    assert app.resume("thing") is True and app.resume("thing") is False
    assert sorted(j.id for j in claim(app, flow, ids)) == sorted(ids)
    assert app.paused() == []


def test_pause_of_an_unknown_type_stores_nothing(
    make_app: Callable[..., App], database_url: str
) -> None:
    app = make(make_app())
    with pytest.raises(UnknownJobType, match="thin"):
        app.pause("thin")
    assert sql(database_url, "SELECT count(*) FROM hivejobs_flow")[0][0] == 0


def test_the_running_rows_are_counted_only_when_asked(make_app: Callable[..., App]) -> None:
    """A rate alone needs no count of the running rows (Limits.type_cap): neither the look
    before a pop nor the claim under the lock makes it then; with a cap both see it."""
    app = make(make_app())
    flows = FlowStore(app.connections.store)
    flows.ensure("capped")
    ids = app.enqueue_many("capped", [{}] * 3)
    assert (
        len(
            claim(app, Flow(app.connections.store, app.connections.broker, "capped", None), ids[:2])
        )
        == 2
    )
    seen: list[FlowState] = []

    def note(state: FlowState) -> Room:
        seen.append(state)
        return Room(allowed=0, wait_s=0.0, tokens=None)

    for counts, running in ((False, 0), (True, 2)):
        looked = flows.state("capped", counts_running=counts)
        assert looked is not None and looked.running == running
        seen.clear()
        with app.connections.store.connection() as conn:
            claimed = flows.claim_limited(
                conn, ids[2:], new_worker_id(), "capped", note, counts_running=counts
            )
        assert claimed == [] and [s.running for s in seen] == [running]


def test_flow_reads_back_pause_and_scale(make_app: Callable[..., App]) -> None:
    """App.flow (what `hivejobs serve` answers): the code's concurrency, the scale and the
    pause as stored, with the defaults for a type that has no flow row."""
    app = make(make_app())
    fresh = app.flow("thing")
    assert (fresh.paused, fresh.paused_at, fresh.scaled_concurrency) == (False, None, None)
    assert fresh.concurrency == app.types["thing"].concurrency
    app.pause("thing")
    app.scale("thing", 7)
    both = app.flow("thing")
    assert (both.paused, both.scaled_concurrency) == (True, 7) and both.paused_at is not None
    assert (
        Flow(app.connections.store, app.connections.broker, "thing", None).scaled_concurrency() == 7
    )  # the pool's
    app.resume("thing")
    app.scale("thing", None)
    assert app.flow("thing") == fresh
    with pytest.raises(UnknownJobType, match="thin"):
        app.flow("thin")


def test_racing_limited_claims_never_exceed_the_limit(make_app: Callable[..., App]) -> None:
    """16 threads claim and finish jobs as fast as they can; each counts itself in while it
    holds a claim (after its commit, before its completion's): never more than 3 at once."""
    app = make(make_app())
    ids = app.enqueue_many("capped", [{}] * 120)
    lock = threading.Lock()
    holding = peak = 0
    left = list(ids)

    def worker() -> None:
        nonlocal holding, peak
        flow = Flow(
            app.connections.store, app.connections.broker, "capped", Limits(global_concurrency=3)
        )
        flow.room(1)  # makes the flow row, as a pool's first look does
        while True:
            with lock:
                if not left:
                    return
                batch = left[-2:]
            jobs = claim(app, flow, batch)
            with lock:
                holding += len(jobs)
                peak = max(peak, holding)
                for j in jobs:
                    left.remove(j.id)
            done = [
                Completion(id=j.id, claim_token=j.claim_token, outcome="succeeded") for j in jobs
            ]
            with lock:
                holding -= len(jobs)
            if done:
                with app.connections.store.connection() as conn:
                    app.connections.store.finish(done, conn)

    threads = [threading.Thread(target=worker) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not left
    assert 1 <= peak <= 3


BY = Limits(global_concurrency=2, limit_by="customer")


def make_by(app: App) -> App:
    app.job("per_customer", global_concurrency=2, limit_by="customer")(lambda ctx, payload: None)
    app.connections.store.upsert_job_types([jt.info() for jt in app.types.values()])
    return app


def test_racing_partitioned_claims_never_exceed_the_limit_per_customer(
    make_app: Callable[..., App],
) -> None:
    """16 threads claim and finish jobs of 3 customers as fast as they can, counting each
    claim in per customer while it is held: never more than 2 of one customer at once, and
    every customer reaches its bound (a full one does not hold the others back)."""
    app = make_by(make_app())
    customers = ["acme", "globex", "initech"]
    owner: dict[str, str] = {}
    for c in customers:
        for job_id in app.enqueue_many("per_customer", [{"customer": c}] * 40):
            owner[job_id] = c
    lock = threading.Lock()
    holding = dict.fromkeys(customers, 0)
    peak = dict.fromkeys(customers, 0)
    left = list(owner)

    def finish(jobs: list[ClaimedJob]) -> None:
        with lock:  # counted out before the completion commits: still inside the slot
            for j in jobs:
                holding[owner[j.id]] -= 1
        done = [Completion(id=j.id, claim_token=j.claim_token, outcome="succeeded") for j in jobs]
        if done:
            with app.connections.store.connection() as conn:
                app.connections.store.finish(done, conn)

    def worker(n: int) -> None:
        # Each thread keeps its last claims while it claims again, so holders overlap.
        flow = Flow(app.connections.store, app.connections.broker, "per_customer", BY)
        flow.room(1)  # makes the flow row, as a pool's first look does
        kept: list[ClaimedJob] = []
        while True:
            with lock:
                if not left:
                    break
                batch = left[n % len(left) :][:3] or left[:3]
            jobs = claim(app, flow, batch)
            with lock:
                for j in jobs:
                    holding[owner[j.id]] += 1
                    peak[owner[j.id]] = max(peak[owner[j.id]], holding[owner[j.id]])
                    left.remove(j.id)
            finish(kept)
            kept = jobs
        finish(kept)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not left
    assert peak == dict.fromkeys(customers, 2)


def test_a_full_partition_does_not_block_the_others_and_waits_at_the_tail(
    make_app: Callable[..., App],
) -> None:
    app = make_by(make_app())
    flow = Flow(app.connections.store, app.connections.broker, "per_customer", BY)
    flow.room(1)
    held = app.enqueue_many("per_customer", [{"customer": "a"}] * 2)
    app.flush()
    first = claim(app, flow, app.connections.broker.pop("per_customer", 2).ids)
    assert sorted(j.id for j in first) == sorted(held)  # a is full
    waiting_a = app.enqueue_many("per_customer", [{"customer": "a"}] * 3)
    b = app.enqueue("per_customer", {"customer": "b"})
    app.flush()
    popped = app.connections.broker.pop("per_customer", 10)
    assert popped.ids == [*waiting_a, b]
    jobs = claim(app, flow, popped.ids)
    assert [j.id for j in jobs] == [b]  # b runs at once, behind a's waiting jobs
    assert flow.put_back(popped, jobs) == 0.0  # it claimed something: pop again now
    popped = app.connections.broker.pop("per_customer", 10)
    assert popped.ids == waiting_a  # at the tail, in order, kept
    # Only a's jobs left: nothing claimed, they go back, and the pool waits for a slot.
    assert claim(app, flow, popped.ids) == []
    assert flow.put_back(popped, []) == SLOT_POLL_S
    # A slot of a frees: one more of a may start, not two.
    done = [Completion(id=first[0].id, claim_token=first[0].claim_token, outcome="succeeded")]
    with app.connections.store.connection() as conn:
        app.connections.store.finish(done, conn)
    popped = app.connections.broker.pop("per_customer", 10)
    assert [j.id for j in claim(app, flow, popped.ids)] == waiting_a[:1]


def test_a_partitioned_payload_without_its_field_stores_nothing(
    make_app: Callable[..., App], database_url: str
) -> None:
    app = make_by(make_app())
    with pytest.raises(PayloadInvalid, match="no 'customer' field"):
        app.enqueue("per_customer", {"client": "a"})
    with pytest.raises(PayloadInvalid, match="needs a JSON object payload"):
        app.enqueue_many("per_customer", [{"customer": "a"}, ["a"]])
    assert sql(database_url, "SELECT count(*) FROM hivejobs_job")[0][0] == 0


def test_a_chain_step_of_a_partitioned_type_needs_the_field(
    make_app: Callable[..., App], database_url: str
) -> None:
    app = make_by(make_app())
    chain = Chain("exports")
    chain.job("per_customer", {"client": "x"})
    with pytest.raises(ChainInvalid, match="no 'customer' field"):
        app.run_chain(chain)
    assert sql(database_url, "SELECT count(*) FROM hivejobs_job")[0][0] == 0
