"""Chain ordering, from the traverser's pure plan: a job starts only once every one of its
predecessors succeeded. Every pair of predecessor states is tried, including tries that
ended since the last pass (reaped in the same pass that decides what starts)."""

from __future__ import annotations

import itertools
import random
from datetime import UTC, datetime

import pytest

from hivejobs.coordinator.traverser import plan_chain
from hivejobs.records.chains import ChainJobState
from hivejobs.records.jobs import TerminalState
from hivejobs.store.traversal import FinishedTry, JobRow, Snapshot

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
# A predecessor as stored, or a running try that finished since: (stored state, archived
# state of its try or None, tries allowed).
PREDECESSOR: dict[str, tuple[ChainJobState, TerminalState | None, int]] = {
    "pending": ("pending", None, 1),
    "running": ("running", None, 1),
    "succeeded": ("succeeded", None, 1),
    "failed": ("failed", None, 1),
    "stopped": ("stopped", None, 1),
    "running, try succeeded": ("running", "succeeded", 1),
    "running, try failed for good": ("running", "failed", 1),
    "running, try failed, retried": ("running", "failed", 2),
    "running, try expired": ("running", "expired", 1),
    "running, try cancelled": ("running", "cancelled", 1),
}


def row(key: str, state: ChainJobState, after: list[str], tries: int = 1) -> JobRow:
    ran = state in ("running", "failed", "succeeded")
    return JobRow(
        key=key,
        name="t",
        payload=b"{}",
        priority=0,
        delivery="at_least_once",
        after_keys=after,
        seq=None,
        tries=tries,
        retry_wait_s=0.0,
        state=state,
        try_=1 if ran else 0,
        total_tries=1 if ran else 0,
        job_id=f"c:{key}:1" if ran else None,
        not_before=None,
    )


def snapshot(jobs: list[JobRow], finished: dict[str, TerminalState]) -> Snapshot:
    return Snapshot(
        id="c",
        state="running",
        stop_requested=False,
        now=NOW,
        jobs={r.key: r for r in jobs},
        seq_tries={},
        seq_limits={},
        finished=[
            FinishedTry(k, f"c:{k}:1", state, None if state == "succeeded" else "x", None, NOW, NOW)
            for k, state in finished.items()
        ],
    )


@pytest.mark.parametrize(
    ("a", "b"), list(itertools.product(PREDECESSOR, repeat=2)), ids=lambda s: s.replace(" ", "_")
)
def test_a_job_starts_only_after_every_predecessor_succeeded(a: str, b: str) -> None:
    jobs: list[JobRow] = []
    finished: dict[str, TerminalState] = {}
    for key, name in (("a", a), ("b", b)):
        stored, ended, tries = PREDECESSOR[name]
        jobs.append(row(key, stored, [], tries))
        if ended is not None:
            finished[key] = ended
    jobs.append(row("c", "pending", ["a", "b"]))
    plan = plan_chain(snapshot(jobs, finished))
    assert plan is not None
    started = {r.key for r in plan.tries}
    both = all(PREDECESSOR[n][0] == "succeeded" or PREDECESSOR[n][1] == "succeeded" for n in (a, b))
    assert ("c" in started) == both, (started, plan.state)


def test_no_try_ever_starts_before_its_predecessors_succeeded_in_random_chains() -> None:
    """Random DAGs in random states that a chain can be in (a job that ran had every
    predecessor succeeded; the others are pending): whatever one pass starts has every
    predecessor succeeded in the state that pass leaves."""
    rng = random.Random(37)
    states: list[ChainJobState] = ["pending", "running", "succeeded", "failed", "stopped"]
    checked = 0
    for _ in range(2000):
        n = rng.randint(2, 7)
        keys = [f"j{i}" for i in range(n)]
        jobs: list[JobRow] = []
        for i, key in enumerate(keys):
            after = rng.sample(keys[:i], rng.randint(0, min(i, 3)))
            ready = all(jobs[keys.index(k)].state == "succeeded" for k in after)
            jobs.append(row(key, rng.choice(states) if ready else "pending", after))
        ends: list[TerminalState] = ["succeeded", "failed"]
        finished = {
            r.key: rng.choice(ends) for r in jobs if r.state == "running" and rng.random() < 0.5
        }
        snap = snapshot(jobs, finished)
        plan = plan_chain(snap)
        assert plan is not None
        for started in plan.tries:
            for pred in started.after_keys:
                assert snap.jobs[pred].state == "succeeded", (started.key, pred, snap.jobs)
            checked += 1
    assert checked > 500  # the chains drawn do start jobs


def test_a_stopped_job_whose_predecessor_went_back_to_pending_is_resumed_not_started() -> None:
    """A sequence retry resets a predecessor to pending while a job after it (outside the
    sequence) still runs; a shutdown then stops that job. The next pass resumes it: back to
    pending, kept waiting for its predecessor, and the pass is planned (it raised KeyError
    and failed on that chain at every pass)."""
    jobs = [row("s2", "pending", []), row("d", "stopped", ["s2"])]
    plan = plan_chain(snapshot(jobs, {}))
    assert plan is not None
    assert {r.key for r in plan.tries} == {"s2"}
    resumed = {c.key: c for c in plan.changes}["d"]
    assert (resumed.was, resumed.state, resumed.mode) == ("stopped", "pending", "keep")
