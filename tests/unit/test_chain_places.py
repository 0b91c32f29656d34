"""A sequenced chain step's place in its key's line, from the traverser's pure plan: kept
while the chain may still try the step, given up when it ended for good or with its chain,
holding the key only for a failure for good under on_failure="hold", never for a stop."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from hivejobs.coordinator.traverser import plan_chain
from hivejobs.records.chains import ChainJobState
from hivejobs.records.jobs import TerminalState
from hivejobs.store.traversal import FinishedTry, JobRow, Snapshot

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)


def step(
    state: ChainJobState,
    *,
    tries: int = 1,
    try_: int = 1,
    seq: str | None = None,
    hold: bool = True,
    key: str = "post",
    after: tuple[str, ...] = (),
) -> JobRow:
    return JobRow(
        key=key, name="post_entry", payload=b"{}", priority=0, delivery="at_least_once",
        after_keys=list(after), seq=seq, tries=tries, retry_wait_s=0.0, state=state,
        try_=try_, total_tries=try_, job_id=f"c:{key}:{try_}" if try_ else None,
        not_before=None, seq_key='"a"', seq_hold=hold, has_place=True,
    )  # fmt: skip


def snap(
    jobs: list[JobRow],
    finished: dict[str, TerminalState],
    *,
    stop: bool = False,
    seq_try: int = 1,
    retries: int = 0,
) -> Snapshot:
    starts = {j.seq for j in jobs if j.seq is not None}
    return Snapshot(
        id="c", state="running", stop_requested=stop, now=NOW,
        jobs={j.key: j for j in jobs},
        seq_tries={s: seq_try for s in starts},
        seq_limits={s: (retries, 0.0) for s in starts},
        finished=[
            FinishedTry(key=k, id=f"c:{k}:{jobs[0].try_}", state=s, error="boom", result=None,
                        started_at=NOW, finished_at=NOW)
            for k, s in finished.items()
        ],
    )  # fmt: skip


# (case, jobs, archived tries, snapshot options, expected end_places)
CASES: list[tuple[str, list[JobRow], dict[str, TerminalState], dict[str, object], object]] = [
    ("try running", [step("running")], {}, {}, {}),
    ("try failed, tries left", [step("running", tries=2)], {"post": "failed"}, {}, {}),
    ("try expired, tries left", [step("running", tries=2)], {"post": "expired"}, {}, {}),
    ("pending for its retry", [step("pending", tries=2)], {}, {}, {}),
    ("failed for good, hold", [step("running")], {"post": "failed"}, {}, {"post": True}),
    (
        "failed for good, continue",
        [step("running", hold=False)],
        {"post": "failed"},
        {},
        {"post": False},
    ),
    ("succeeded", [step("running")], {"post": "succeeded"}, {}, {"post": False}),
    (
        "stopped by a chain stop",
        [step("running")],
        {"post": "cancelled"},
        {"stop": True},
        {"post": False},
    ),  # fmt: skip
    (
        "try failed during a chain stop",
        [step("running", tries=3)],
        {"post": "failed"},
        {"stop": True},
        {"post": False},
    ),  # fmt: skip
    ("suspended (stopped, no stop asked)", [step("stopped")], {}, {}, {}),
    (
        "failed, its chain sequence retries it",
        [step("running", seq="post")],
        {"post": "failed"},
        {"retries": 1},
        {},
    ),
    (
        "failed, its sequence waits for another job",
        [
            step("running", seq="post"),
            step("running", seq="post", key="other", after=("post",), hold=False),
        ],
        {"post": "failed"},
        {"retries": 1},
        {},
    ),
    (
        "failed, its chain sequence exhausted",
        [step("running", seq="post")],
        {"post": "failed"},
        {"retries": 1, "seq_try": 2},
        {"post": True},
    ),
    (
        "pending, its chain failed elsewhere",
        [step("pending", try_=0, after=("x",)), step("failed", key="x", hold=False)],
        {},
        {},
        {"post": False, "x": False},
    ),
]


@pytest.mark.parametrize(("case", "jobs", "finished", "options", "expected"), CASES,
                         ids=[c[0] for c in CASES])  # fmt: skip
def test_place_kept_or_ended(
    case: str,
    jobs: list[JobRow],
    finished: dict[str, TerminalState],
    options: dict[str, object],
    expected: object,
) -> None:
    stop = bool(options.get("stop", False))
    seq_try = int(str(options.get("seq_try", 1)))
    retries = int(str(options.get("retries", 0)))
    plan = plan_chain(snap(jobs, finished, stop=stop, seq_try=seq_try, retries=retries))
    assert plan is not None
    assert plan.end_places == expected, case


def test_a_step_without_a_place_ends_none() -> None:
    plain = step("running")
    plain.has_place = False
    plan = plan_chain(snap([plain], {"post": "failed"}))
    assert plan is not None and plan.end_places == {}
