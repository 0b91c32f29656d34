"""Flow control on real Postgres and Redis (issue 12): the claim under a pause or a limit,
racing claimers, and the pause API's edges."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from hivejobs import App, UnknownJobType
from hivejobs.flow import Flow, Limits
from hivejobs.records import ClaimedJob, Completion
from hivejobs.store import new_worker_id
from tests.harness import sql


def make(app: App) -> App:
    app.job("thing")(lambda ctx, payload: None)
    app.job("capped", global_concurrency=3)(lambda ctx, payload: None)
    app.store.upsert_job_types([jt.info() for jt in app.types.values()])
    return app


def claim(app: App, flow: Flow, ids: list[str]) -> list[ClaimedJob]:
    with app.store.connection() as conn:
        return flow.claim(conn, ids, new_worker_id())


def test_a_paused_type_claims_nothing_and_its_ids_go_back(
    make_app: Callable[..., App], database_url: str
) -> None:
    app = make(make_app())
    flow = Flow(app.store, app.broker, "thing", None)
    ids = app.enqueue_many("thing", [{}] * 4)
    app.flush()
    assert app.pause("thing") is True
    assert app.pause("thing") is False  # already paused
    assert app.paused() == ["thing"]
    popped = app.broker.pop("thing", 4)
    assert claim(app, flow, popped.ids) == []
    flow.put_back(popped, [])
    assert app.broker.pop("thing", 10).ids == popped.ids  # back at the head, in order
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
        flow = Flow(app.store, app.broker, "capped", Limits(global_concurrency=3))
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
                with app.store.connection() as conn:
                    app.store.finish(done, conn)

    threads = [threading.Thread(target=worker) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not left
    assert 1 <= peak <= 3
