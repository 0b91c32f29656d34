"""The traverser's stop decisions as a table of snapshots (plan_chain is pure): which final
state wins after a stop, and when a stop gives up on tries that ignore ctx.stopping."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from hivejobs.coordinator.traverser import plan_chain
from hivejobs.records.chains import ChainJobState, ChainState
from hivejobs.store.traversal import FinishedTry, JobRow, Snapshot

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def row(key: str, state: ChainJobState) -> JobRow:
    return JobRow(
        key=key,
        name="t",
        payload=b"{}",
        priority=0,
        delivery="at_least_once",
        after_keys=[],
        seq=None,
        tries=1,
        retry_wait_s=0.0,
        state=state,
        try_=1 if state in ("running", "failed", "succeeded") else 0,
        total_tries=1,
        job_id=f"c:{key}:1",
        not_before=None,
    )


def snapshot(
    states: dict[str, ChainJobState], stop_by_s: float | None, finished: list[str]
) -> Snapshot:
    return Snapshot(
        id="c",
        state="running",
        stop_requested=True,
        now=NOW,
        jobs={k: row(k, s) for k, s in states.items()},
        seq_tries={},
        seq_limits={},
        finished=[
            FinishedTry(k, f"c:{k}:1", "cancelled", "chain stopped", None, NOW, NOW)
            for k in finished
        ],
        stop_by=None if stop_by_s is None else NOW + timedelta(seconds=stop_by_s),
    )


@pytest.mark.parametrize(
    ("states", "stop_by_s", "finished", "state", "abandon", "wake_in_s"),
    [
        # Nothing runs: a job failed for good makes the chain failed, stop or not.
        ({"a": "failed", "b": "stopped"}, -1, [], "failed", [], None),
        ({"a": "succeeded", "b": "stopped"}, -1, [], "stopped", [], None),
        ({"a": "succeeded", "b": "pending"}, -1, [], "stopped", [], None),
        # A try still runs before the deadline: look again at the deadline.
        ({"a": "running"}, 5, [], "running", [], 5.0),
        # Past the deadline: abandon it (the next pass reaps it as stopped).
        ({"a": "running", "b": "failed"}, -1, [], "running", ["c:a:1"], None),
        # A try that ended meanwhile is reaped, never abandoned.
        ({"a": "running", "b": "running"}, -1, ["a"], "running", ["c:b:1"], None),
        ({"a": "running"}, -1, ["a"], "stopped", [], None),
    ],
)
def test_stop_decisions(
    states: dict[str, ChainJobState],
    stop_by_s: float,
    finished: list[str],
    state: ChainState,
    abandon: list[str],
    wake_in_s: float | None,
) -> None:
    plan = plan_chain(snapshot(states, stop_by_s, finished))
    assert plan is not None
    assert plan.state == state
    assert plan.abandon == abandon
    if abandon:
        assert "ignored ctx.stopping" in plan.abandon_error
    expected = None if wake_in_s is None else NOW + timedelta(seconds=wake_in_s)
    assert plan.wake_at == expected
