"""The gauges' log: the queue depth when it changed (an idle worker's log is not a metronome),
and a warning naming the job types whose queued jobs no live worker serves."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from loguru import logger

from hivejobs import App
from hivejobs.coordinator.gauges import Gauges
from hivejobs.store import new_worker_id
from tests.integration.test_coordinator import logged, make

UNSERVED = "jobs are queued for types no live worker serves"


def test_queue_depth_is_logged_when_it_changes(
    make_app: Callable[..., App], database_url: str
) -> None:
    app = make(make_app(), database_url)
    app.enqueue_many("thing", [{"n": i} for i in range(3)])
    gauges = Gauges(app.connections.store)
    with logged() as lines:
        for _ in range(3):
            gauges.run_once()
        app.enqueue("thing", {"n": 9})
        gauges.run_once()
    depth = [m for level, m in lines if m == "queue depth"]
    assert len(depth) == 2  # the first pass, then the pass that saw one more


def test_a_type_with_queued_jobs_and_no_live_pool_is_named_once(
    make_app: Callable[..., App], database_url: str
) -> None:
    app = make(make_app(), database_url)
    app.job("other")(lambda ctx, payload: None)
    app.connections.store.upsert_job_types([app.types["other"].info()])
    app.enqueue("thing", {"n": 1})
    app.enqueue("other", {})
    # A live pool of "other" only; "thing" has queued jobs and nobody to run them.
    app.connections.store.register_worker(new_worker_id(), "host", 1, "pool", "other")
    gauges = Gauges(app.connections.store, unserved_after_s=0.0)
    with logged() as lines:
        gauges.run_once()
        gauges.run_once()
    warned = [(level, m) for level, m in lines if m.startswith(UNSERVED)]
    assert [level for level, _ in warned] == ["WARNING"]  # once, not every pass


def test_the_warning_names_the_types_after_a_grace(
    make_app: Callable[..., App], database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A starting fleet registers its pools within seconds: no warning before the grace."""
    clock = [1000.0]
    monkeypatch.setattr("hivejobs.coordinator.gauges.time.monotonic", lambda: clock[0])
    app = make(make_app(), database_url)
    app.enqueue("thing", {"n": 1})
    gauges = Gauges(app.connections.store, unserved_after_s=30.0)
    seen: list[object] = []
    logger.enable("hivejobs")
    sink = logger.add(lambda m: seen.append(m.record["extra"].get("types")), level="WARNING")
    try:
        gauges.run_once()
        assert seen == []
        clock[0] += 30.0
        gauges.run_once()
    finally:
        logger.remove(sink)
        logger.disable("hivejobs")
    assert seen == [["thing"]]
    # A pool of the type starts: the warning does not come back.
    app.connections.store.register_worker(new_worker_id(), "host", 1, "pool", "thing")
    with logged() as lines:
        gauges.run_once()
    assert not [m for _, m in lines if m.startswith(UNSERVED)]
