"""Pool roles that need no server: the shared batcher, the slots' one release per claim,
the quarantine's turn, what a stop hands back, and the stop state's exit code."""

from __future__ import annotations

import asyncio
import functools
import threading
from typing import cast

import pytest

from hivejobs.batching import Batcher, coalesce_window
from hivejobs.client.app import App, JobContext
from hivejobs.records.jobs import ClaimedJob, Delivery
from hivejobs.worker.async_handlers import new_loop
from hivejobs.worker.completer import COALESCE_GAP_S, COALESCE_MAX_S, COALESCE_TO
from hivejobs.worker.context import AttemptContext
from hivejobs.worker.executor import interrupted
from hivejobs.worker.exits import ChildExit
from hivejobs.worker.shutdown import Stop, StopReason
from hivejobs.worker.slots import Slots


def job(job_id: str, delivery: Delivery = "at_least_once", lost: int = 0) -> ClaimedJob:
    return ClaimedJob(
        id=job_id,
        name="t",
        attempt=1,
        attempts=3,
        delivery=delivery,
        payload=b"null",
        claim_token=7,
        priority=0,
        lost=lost,
    )


def test_batcher_writes_what_accumulated_while_the_previous_batch_was_written() -> None:
    batches: list[list[int]] = []
    writing = threading.Event()
    go_on = threading.Event()

    def write(batch: list[int]) -> None:
        batches.append(batch)
        if len(batches) == 1:
            writing.set()
            assert go_on.wait(5)

    batcher: Batcher[int] = Batcher(write, max_batch=3, name="test-batcher")
    batcher.start()
    batcher.submit(0)
    assert writing.wait(5)
    batcher.submit_many([1, 2, 3, 4])  # arrive while batch [0] is being written
    assert not batcher.idle()
    assert not batcher.flush(0.05)
    go_on.set()
    assert batcher.flush(5)
    assert batcher.idle()
    assert batches == [[0], [1, 2, 3], [4]]  # never more than max_batch at once


def test_a_small_batch_waits_for_more_only_while_items_come_often() -> None:
    """With short jobs, completions one at a time would cost a commit each: a batch
    waits for the completions due soon, but a lone one at a low rate is written at once.
    From 100 completions a second in a process (10 ms CPU-bound jobs on 2 cores: 130/s),
    two or more arrive within the longest wait, so waiting pays."""
    often = functools.partial(
        coalesce_window, to=COALESCE_TO, gap_s=COALESCE_GAP_S, max_s=COALESCE_MAX_S
    )
    assert (COALESCE_TO, COALESCE_GAP_S, COALESCE_MAX_S) == (16, 0.01, 0.02)
    assert often(1, float("inf")) == 0.0  # nothing measured yet
    assert often(1, 0.02) == 0.0  # 50/s: at once
    assert often(1, 0.0101) == 0.0  # just under 100/s: at once
    assert often(1, 0.0076) == 0.02  # 130/s: the longest wait (2-3 more arrive)
    assert often(1, 0.00125) == pytest.approx(0.01875)  # 800/s: 15 more at 1.25 ms
    assert often(14, 0.0001) == pytest.approx(0.0002)  # two more due
    assert often(16, 0.0001) == 0.0  # full enough
    assert coalesce_window(1, 0.0001, to=0, gap_s=1.0, max_s=1.0) == 0.0  # coalescing off


def test_the_batcher_follows_the_gap_between_items(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr("hivejobs.batching.time.monotonic", lambda: now[0])
    batcher: Batcher[int] = Batcher(
        lambda batch: None,
        max_batch=100,
        name="t",
        coalesce_to=8,
        coalesce_gap_s=0.01,
        coalesce_max_s=0.05,
    )  # never started: only the arrival bookkeeping runs
    batcher.submit(0)
    assert batcher._window(1) == 0.0  # one item says nothing about the rate
    for i in range(50):
        now[0] += 0.001
        batcher.submit(i)
    assert batcher._window(1) == pytest.approx(0.007)  # 7 more at 1 ms each
    now[0] += 60.0  # an idle minute: the next item is written at once
    batcher.submit_many([1, 2])
    assert batcher._window(1) == 0.0


def test_a_slot_is_released_once_whichever_way_its_job_leaves() -> None:
    draining = threading.Event()
    slots = Slots(draining, 2, room_open=lambda: True)
    slots.hand_over([job("a"), job("b"), job("c")])
    assert slots.reserved == 3
    with slots.take() as taken:
        assert taken is not None and taken.id == "a"
        assert slots.reserved == 3  # held while the job runs
    assert slots.reserved == 2
    with pytest.raises(RuntimeError), slots.take():
        raise RuntimeError("a runner's error still releases the slot")
    assert slots.reserved == 1
    assert [j.id for j in slots.drain()] == ["c"]
    assert slots.reserved == 0
    assert list(slots.drain()) == []
    slots.close(1)
    with slots.take() as end:
        assert end is None
    assert slots.reserved == 0


def test_a_freed_slot_wakes_the_waiters_only_when_one_of_them_can_act() -> None:
    draining = threading.Event()
    room = [False]
    slots = Slots(draining, 2, room_open=lambda: room[0])
    with slots.cond:
        assert not slots.wanted()  # claim room closed: the fetcher would only wait again
        room[0] = True
        assert slots.wanted()
        room[0] = False
        slots.isolating = True
        assert slots.wanted()  # a suspect waits for its neighbours to end
        slots.isolating = False
        draining.set()
        assert slots.wanted()  # the shutdown waits for the running ones


def refuse(neighbour: ClaimedJob) -> None:
    raise AssertionError(f"{neighbour.id} handed back: no neighbour was waiting")


def test_a_suspect_hands_back_the_claims_no_runner_took() -> None:
    """One runner: the suspect's own runner is the only one that can hand its waiting
    neighbour back; the neighbour's release, once written, leaves the suspect alone."""
    slots = Slots(threading.Event(), 1, room_open=lambda: True)
    held = {"s": 1, "n": 1}
    given: list[str] = []

    def give_way(neighbour: ClaimedJob) -> None:
        given.append(neighbour.id)
        del held[neighbour.id]  # as the completer's forget, once the release is written

    slots.hand_over([job("s", lost=1), job("n")])
    with slots.take() as suspect:
        assert suspect is not None
        with slots.turn(suspect, held, give_way) as may:
            assert may
    assert given == ["n"]
    assert slots.reserved == 0


def test_a_suspect_runs_alone_and_others_wait_meanwhile() -> None:
    draining = threading.Event()
    slots = Slots(draining, 2, room_open=lambda: True)
    with slots.turn(job("s", lost=1), held={"s"}, give_way=refuse) as suspect_may:
        assert suspect_may  # it holds no other claim
        with slots.turn(job("n"), held={"s", "n"}, give_way=refuse) as neighbour_may:
            assert not neighbour_may  # no job starts beside a suspect
        # A runner's or a task's start of a job that is no suspect: refused the same way.
        assert slots.start_if_may(job("n"), AttemptContext(job("n"))) is None
        assert "n" not in slots.running
        with slots.turn(job("s2", lost=1), held={"s", "s2"}, give_way=refuse) as second_may:
            assert not second_may  # one suspect at a time
    with slots.turn(job("n"), held={"n"}, give_way=refuse) as after:
        assert after
    started = slots.start_if_may(job("n"), AttemptContext(job("n")))
    assert started is not None and slots.running["n"] is started
    assert slots.finished(started)
    draining.set()
    with slots.turn(job("n"), held={"n"}, give_way=refuse) as stopping:
        assert not stopping
    assert slots.start_if_may(job("m"), AttemptContext(job("m"))) is None  # the drain began
    assert "m" not in slots.running


@pytest.mark.parametrize(
    ("delivery", "started", "outcome"),
    [
        ("at_least_once", False, "suspend"),
        ("at_least_once", True, "suspend"),
        ("at_most_once", False, "suspend"),
        ("at_most_once", True, "failed"),  # maybe started: never run again
    ],
)
def test_a_stop_suspends_unless_an_at_most_once_job_may_have_started(
    delivery: Delivery, started: bool, outcome: str
) -> None:
    done = interrupted(job("j", delivery), started=started, max_result_bytes=1024)
    assert (done.id, done.claim_token, done.outcome) == ("j", 7, outcome)


def test_only_a_reload_request_exits_with_reload() -> None:
    for reason, code in [
        (StopReason.SIGNAL, ChildExit.RECYCLE),
        (StopReason.TIMED_OUT, ChildExit.RECYCLE),
        (StopReason.POOL_RESTART, ChildExit.RECYCLE),
        (StopReason.RELOAD, ChildExit.RELOAD),
    ]:
        stop = Stop()
        stop.request(reason)
        assert stop.acquiring_stopped.is_set() and stop.exit_code == code
    stop = Stop()
    stop.request(StopReason.RELOAD)
    stop.signal()  # a SIGTERM after a restart request still reloads
    assert stop.exit_code == ChildExit.RELOAD


def test_runs_settled_together_drop_the_results_the_shutdown_answered_for() -> None:
    slots = Slots(threading.Event(), 4, room_open=lambda: True)
    slots.hand_over([job("a"), job("b"), job("c")])
    claimed = [job("a"), job("b"), job("c")]
    entries = [slots.started(c, JobContext(c, cast(App, None))) for c in claimed]
    with slots.cond:
        entries[1].abandoned = True  # suspended by the shutdown: its own result is dropped
    assert slots.finished_many(entries) == [True, False, True]
    assert slots.running == {}
    slots.release(3)
    assert slots.reserved == 0


def test_the_pool_loop_is_uvloop_where_installed_unless_turned_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    uvloop = pytest.importorskip("uvloop")
    loop = new_loop()
    try:
        assert isinstance(loop, uvloop.Loop)
    finally:
        loop.close()
    monkeypatch.setenv("HIVEJOBS_UVLOOP", "0")
    loop = new_loop()
    try:
        assert not isinstance(loop, uvloop.Loop)
        assert isinstance(loop, asyncio.BaseEventLoop)
    finally:
        loop.close()
