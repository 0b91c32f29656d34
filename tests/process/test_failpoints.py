"""S16 (CI subset): a process dies, or a call fails, at each crash window; nothing is lost.

HIVEJOBS_FAILPOINTS="name=action@n" fires in every process of the instance on its n-th hit
(and again after each restart), so these also prove the restart paths.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hivejobs import App, failpoints
from tests.harness import Instance, fleet_app, ledger_oks, live_jobs, sql, wait_until

pytestmark = pytest.mark.faults


@pytest.mark.parametrize(
    "spec",
    [
        "pool.after_claim_commit=exit@3",
        "pool.before_completion_commit=exit@40",
        "coord.after_lease_before_action=exit@5",
        "pool.after_claim_commit=raise@2",
    ],
)
def test_instance_failpoint_loses_nothing(
    spec: str,
    make_app: Callable[..., App],
    start_instance: Callable[..., Instance],
    database_url: str,
    ledger_dir: Path,
) -> None:
    once = ledger_dir.parent / "fired"
    once.mkdir()
    inst = start_instance(
        {"HJ_TYPES": "alo", "HIVEJOBS_FAILPOINTS": spec, "HIVEJOBS_FAILPOINTS_ONCE_DIR": str(once)}
    )
    app = fleet_app(make_app, database_url, ["alo"])
    ids = app.enqueue_many("alo", [{"ms": 2}] * 300)
    wait_until(lambda: list(once.iterdir()), timeout=30, what="the failpoint to fire")
    wait_until(lambda: live_jobs(database_url) == 0, timeout=60, what="all jobs finished")
    states = dict(sql(database_url, "SELECT id, state FROM hivejobs_archive"))
    assert {states[i] for i in ids} == {"succeeded"}
    oks = ledger_oks(ledger_dir)  # read once: the ledger holds a line per attempt
    assert all(oks[i] >= 1 for i in ids)
    if "pool" in spec:
        assert "child died" in inst.log_text()


@pytest.fixture
def enqueue_failpoint(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("HIVEJOBS_TESTING", "1")
    monkeypatch.setenv("HIVEJOBS_FAILPOINTS", "enqueue.after_commit_before_push=raise@1")
    failpoints.reload()
    yield
    monkeypatch.delenv("HIVEJOBS_FAILPOINTS")
    failpoints.reload()


def test_enqueue_dying_between_commit_and_push_is_dispatched_later(
    enqueue_failpoint: None,
    make_app: Callable[..., App],
    start_instance: Callable[..., Instance],
    database_url: str,
    ledger_dir: Path,
) -> None:
    """R1's second trigger: committed but never pushed; the reconciler finds it by age."""
    start_instance({"HJ_TYPES": "alo"})
    app = fleet_app(make_app, database_url, ["alo"])
    # Once the first start's full restore is done, only the age-based re-push can find it.
    wait_until(app.connections.broker.boot_marker_present, what="the coordinator's first restore")
    with pytest.raises(RuntimeError, match="failpoint"):
        app.enqueue("alo", {"ms": 1}, id="stranded")
    assert sql(database_url, "SELECT state FROM hivejobs_job WHERE id = 'stranded'") == [
        ("queued",)
    ]
    wait_until(
        lambda: app.get_job("stranded").state == "succeeded",
        timeout=15,
        what="the reconciler pushed the stranded job",
    )
    assert ledger_oks(ledger_dir)["stranded"] == 1
    assert os.environ["HIVEJOBS_FAILPOINTS"]
