"""Operating chains (spincycle's semantics) on real `hivejobs run` instances, Redis, Postgres.

Stop timeout and stop(wait=True); failed wins over stopped; stop while suspended; the job
log with start, finish, state, traceback and bounded output (API and CLI); results from any
ancestor and Struct args; `chain list` filters and `chain ps`.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from hivejobs import App, Chain, ChainInvalid
from tests.apps.controlapp import DeployArgs
from tests.apps.gate import open_gate
from tests.harness import ROOT, Instance, pool_pids, read_ledger, sql, wait_until

FINAL = ("succeeded", "failed", "stopped")


@pytest.fixture
def app15(make_app: Callable[..., App]) -> App:
    """An App that knows every controlapp type (the fleet may run only some of them)."""
    from tests.apps.controlapp import app as declared

    app = make_app()
    app.types.update(declared.types)
    return app


@pytest.fixture
def instance15(start_instance: Callable[..., Instance]) -> Callable[..., Instance]:
    def start(
        types: str, extra_env: dict[str, str] | None = None, args: list[str] | None = None
    ) -> Instance:
        env = {"HJ_TYPES": types, **(extra_env or {})}
        return start_instance(env, args, app_spec="tests.apps.controlapp:app")

    return start


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hivejobs", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def wait_final(app: App, request_id: str, timeout: float = 30.0) -> str:
    state: str = wait_until(
        lambda: (s := app.chain_status(request_id).state) in FINAL and s,
        timeout=timeout,
        what=f"chain {request_id} to finish",
    )
    return state


def running_keys(app: App, request_id: str) -> set[str]:
    return {
        j.key
        for j in app.chain_status(request_id).jobs
        if j.state == "running" and j.status is not None
    }


def test_stop_gives_up_on_a_try_that_ignores_stopping_after_the_timeout(
    app15: App, instance15: Callable[..., Instance], ledger_dir: Path, database_url: str
) -> None:
    inst = instance15("coop,stubborn")
    chain = Chain("stubborn-stop")
    # Both hold at gates: the deaf one until the test has seen it abandoned, the polite one
    # until the stop (never opened).
    chain.job("stubborn", {"gate": "deaf"}, key="deaf")
    chain.job("coop", {"gate": "never"}, key="polite")
    request_id = app15.run_chain(chain)
    wait_until(lambda: running_keys(app15, request_id) == {"deaf", "polite"}, what="both running")
    began = time.monotonic()
    assert app15.stop_chain(request_id, timeout=1.0, wait=True) is True
    waited = time.monotonic() - began
    log = {e.key: e for e in app15.job_log(request_id)}
    # wait=True returned once the chain ended: the stubborn try was abandoned at the timeout,
    # while its handler still ran (no end line yet).
    deaf_id = log["deaf"].job_id
    assert not any(p[0] == "end" and p[1] == deaf_id for p in read_ledger(ledger_dir))
    assert app15.chain_status(request_id).state == "stopped"
    assert waited >= 0.9, waited
    open_gate(app15.connections.broker, "deaf")
    assert log["deaf"].state == "stopped" and log["polite"].state == "stopped"
    assert "ignored ctx.stopping past the stop timeout" in (log["deaf"].error or "")
    assert "ignored" not in (log["polite"].error or "")
    jobs = {j.key: j for j in app15.chain_status(request_id).jobs}
    assert jobs["deaf"].try_ == 0  # a stop is not a try, abandoned or not
    # The abandoned handler finishes later: its completion is fenced out, nothing changes.
    wait_until(
        lambda: any(p[0] == "end" and p[1] == deaf_id for p in read_ledger(ledger_dir)),
        what="the stubborn handler to return",
    )
    wait_until(lambda: "completion fenced out" in inst.log_text(), what="its completion fenced out")
    assert sql(database_url, "SELECT state FROM hivejobs_archive WHERE id = %s", (deaf_id,)) == [
        ("cancelled",)
    ]
    assert app15.chain_status(request_id).state == "stopped"


def test_stop_of_a_chain_with_a_job_failed_for_good_ends_failed(
    app15: App,
    instance15: Callable[..., Instance],
    database_url: str,
    instance_env: dict[str, str],
) -> None:
    instance15("coop,broken")
    chain = Chain("half-broken")
    chain.job("broken", {}, key="bad")
    chain.job("coop", {"gate": "never"}, key="long")  # ends only through the stop
    request_id = app15.run_chain(chain)
    wait_until(
        lambda: (
            {j.key: j.state for j in app15.chain_status(request_id).jobs}
            == {"bad": "failed", "long": "running"}
        ),
        what="bad failed for good while long runs",
    )
    env = {**instance_env, "HIVEJOBS_APP": "tests.apps.controlapp:app"}
    stopped = cli(env, "chain", "stop", request_id, "--wait")
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout.strip() == "failed"  # the state it ended in
    assert app15.chain_status(request_id).state == "failed"
    # With no --timeout, the setting (chain_stop_timeout_s, 30 s) gave the deadline.
    left = sql(
        database_url,
        "SELECT extract(epoch FROM stop_by - finished_at) FROM hivejobs_chain WHERE id = %s",
        (request_id,),
    )[0][0]
    assert 20 < left <= 30
    jobs = {j.key: j.state for j in app15.chain_status(request_id).jobs}
    assert jobs == {"bad": "failed", "long": "stopped"}


def test_stop_while_suspended_ends_the_chain_without_running_it_again(
    app15: App, instance15: Callable[..., Instance], ledger_dir: Path
) -> None:
    a = instance15("coop", args=["--shutdown-timeout", "2"])
    chain = Chain("suspended-stop")
    chain.job("coop", {"gate": "never"}, key="long", tries=2)  # ends only through SIGTERM
    chain.job("step", {}, key="after", after=["long"])
    request_id = app15.run_chain(chain)
    wait_until(lambda: running_keys(app15, request_id) == {"long"}, what="long running")
    a.signal_group(signal.SIGTERM)
    assert a.wait(15) == 0
    assert app15.chain_status(request_id).state == "suspended"
    assert app15.stop_chain(request_id) is True  # kept: see README, "Stopping a chain"
    instance15("coop,step")  # a coordinator to finish it, pools that could resume it
    assert wait_final(app15, request_id) == "stopped"
    jobs = {j.key: j for j in app15.chain_status(request_id).jobs}
    assert (jobs["long"].state, jobs["long"].total_tries) == ("stopped", 1)
    assert jobs["after"].state == "pending"
    starts = [p[1] for p in read_ledger(ledger_dir) if p[0] == "start"]
    assert starts == [f"{request_id}:long:1"]  # never resumed


def test_job_log_keeps_times_state_traceback_and_bounded_output(
    app15: App, instance15: Callable[..., Instance], instance_env: dict[str, str]
) -> None:
    instance15("printer", {"HIVEJOBS_JOB_LOG_OUTPUT_BYTES": "2000"})
    chain = Chain("printing")
    chain.job("printer", {"lines": 400, "secret": "s3cr3t-payload"}, key="p", tries=2)
    request_id = app15.run_chain(chain)
    assert wait_final(app15, request_id) == "succeeded"
    first, second = app15.job_log(request_id)
    assert (first.key, first.try_, first.state) == ("p", 1, "failed")
    assert (second.try_, second.state) == (2, "succeeded")
    for entry in (first, second):
        assert entry.started_at is not None and entry.finished_at >= entry.started_at
    assert first.error is not None and "Traceback" in first.error
    assert "ValueError: printer fails its first try" in first.error
    # 400 lines of ~23 bytes: only the last 2000 bytes are kept, and the cut is said.
    assert first.output_truncated and first.stdout is not None
    assert first.stdout.startswith("[... ") and "bytes cut" in first.stdout
    assert first.stdout.rstrip().endswith("out line 399 of try 1")
    assert "out line 0 of" not in first.stdout
    # stderr: what the handler wrote, and nothing of hivejobs' own lines about the try (its
    # started / retry / traceback lines go to the worker's log; the traceback is in `error`).
    assert first.stderr == "err line of try 1\n"
    assert second.stderr == "err line of try 2\n" and second.error is None
    env = {**instance_env, "HIVEJOBS_APP": "tests.apps.controlapp:app"}
    shown = cli(env, "chain", "log", request_id)
    assert shown.returncode == 0, shown.stderr
    assert "p  try 1  printer  FAILED" in shown.stdout
    assert "p  try 2  printer  SUCCEEDED" in shown.stdout
    assert "    ValueError: printer fails its first try" in shown.stdout
    assert "  stdout (cut: the end is kept):" in shown.stdout
    assert "    err line of try 2" in shown.stdout
    assert "    out line 399 of try 2" in shown.stdout
    status = cli(env, "chain", "status", "--log", request_id)
    assert status.returncode == 0, status.stderr
    assert "SUCCEEDED" in status.stdout and "job log" in status.stdout
    assert "p  try 1  printer  FAILED" in status.stdout
    assert "s3cr3t-payload" not in shown.stdout + status.stdout  # never the payload


def test_result_of_any_ancestor_and_struct_args(
    app15: App, instance15: Callable[..., Instance], database_url: str
) -> None:
    bad = Chain("deploy", args={"env": "prod", "replicas": "three"}, args_type=DeployArgs)
    bad.job("step", {}, key="a")
    with pytest.raises(ChainInvalid, match=r"args do not fit DeployArgs: Expected `int`"):
        app15.run_chain(bad)
    assert sql(database_url, "SELECT count(*) FROM hivejobs_chain")[0][0] == 0
    instance15("step,reader")
    chain = Chain("deploy", args=DeployArgs(env="prod", replicas=3))
    a = chain.job("step", {"n": 7}, key="a")
    b = chain.job("step", {}, key="b", after=[a])
    chain.job("step", {}, key="side")
    chain.job("reader", {"grandparent": "a", "not_ancestor": "side"}, key="c", after=[b])
    request_id = app15.run_chain(chain)
    assert wait_final(app15, request_id) == "succeeded"
    status = app15.chain_status(request_id)
    assert status.args == {"env": "prod", "replicas": 3}
    result = {j.key: j for j in status.jobs}["c"].result
    assert isinstance(result, dict)
    assert result["grandparent"] == {"key": "a", "n": 7}
    assert (result["env"], result["replicas"]) == ("prod", 3)
    assert result["refused"].startswith("job 'side' is not an ancestor of 'c'")
    assert "(a, b)" in result["refused"]


def test_chain_list_filters_and_ps_shows_what_runs(
    app15: App, instance15: Callable[..., Instance], instance_env: dict[str, str]
) -> None:
    instance15("step,coop")
    quick = Chain("nightly")
    quick.job("step", {}, key="only")
    done_id = app15.run_chain(quick)
    assert wait_final(app15, done_id) == "succeeded"
    slow = Chain("backfill")
    slow.job("coop", {"gate": "never"}, key="copy")  # runs until the instance stops
    live_id = app15.run_chain(slow)
    wait_until(lambda: running_keys(app15, live_id) == {"copy"}, what="copy running")

    assert [c.id for c in app15.list_chains(state="running")] == [live_id]
    assert [c.id for c in app15.list_chains(type="nightly")] == [done_id]
    assert [c.id for c in app15.list_chains(job_type="coop")] == [live_id]
    assert {c.id for c in app15.list_chains(state=["running", "succeeded"])} == {done_id, live_id}
    first = app15.list_chains(limit=1)
    assert [c.id for c in first] == [live_id]  # newest first
    page2 = app15.list_chains(limit=1, before=(first[0].created_at, first[0].id))
    assert [c.id for c in page2] == [done_id]

    env = {**instance_env, "HIVEJOBS_APP": "tests.apps.controlapp:app"}
    listed = cli(env, "chain", "list", "--state", "succeeded", "--since", "1h")
    assert listed.returncode == 0, listed.stderr
    assert done_id in listed.stdout and live_id not in listed.stdout
    old = cli(env, "chain", "list", "--until", "1h")
    assert old.returncode == 0 and done_id not in old.stdout and live_id not in old.stdout

    tries = app15.chain_ps()
    assert [(t.chain_id, t.key, t.type, t.try_, t.state) for t in tries] == [
        (live_id, "copy", "coop", 1, "running")
    ]
    pid = pool_pids(sql_url(instance_env), "coop")[0]
    assert (tries[0].host, tries[0].pid) == (socket.gethostname(), pid)
    assert tries[0].status is not None and tries[0].status.startswith("working")
    assert tries[0].age_s is not None and tries[0].age_s >= 0
    ps = cli(env, "chain", "ps")
    assert ps.returncode == 0, ps.stderr
    line = next(x for x in ps.stdout.splitlines() if x.startswith(live_id))
    for text in ("backfill", "copy", "coop", "1/1 (total 1)", "running", str(pid), "working"):
        assert text in line


def sql_url(env: dict[str, str]) -> str:
    return env["HIVEJOBS_DATABASE_URL"]
