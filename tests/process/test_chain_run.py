"""Chains on real `hivejobs run tests.apps.chainapp:app` instances, Redis and Postgres.

Diamond, a 200-job fan-out into a merge job, sequence retries (recovered and exhausted),
stop mid-chain; then faults (RELIABILITY S3 chain part, S14): SIGTERM of the instance running
a chain's long jobs suspends the chain (interrupted tries stopped, not counted) and a second
instance resumes it; kill -9 of the leader's coordinator mid-traversal loses nothing. Waits
poll Postgres with a deadline; the ledger proves no try ran twice. The tests that depend on
how a handler runs (results upstream, failures, a stop, a SIGTERM) run with `def` and
`async def` handlers alike (chainapp's HJ_ASYNC).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from hivejobs import App, Chain
from tests.apps.gate import open_gate
from tests.harness import (
    HANDLER_KINDS,
    Instance,
    alive,
    handler_env,
    ledger_starts,
    read_ledger,
    sql,
    wait_until,
)

FINAL = ("succeeded", "failed", "stopped")
KINDS = pytest.mark.parametrize("kind", HANDLER_KINDS)


def wait_final(app: App, request_id: str, timeout: float = 45.0) -> str:
    state: str = wait_until(
        lambda: (s := app.chain_status(request_id).state) in FINAL and s,
        timeout=timeout,
        what=f"chain {request_id} to finish",
    )
    return state


def assert_no_try_twice(ledger_dir: Path) -> None:
    twice = {k: n for k, n in ledger_starts(ledger_dir).items() if n > 1}
    assert not twice, f"tries started more than once: {twice}"


def assert_ran_as(ledger_dir: Path, kind: str) -> None:
    """Every try's handler ran as `kind` (on the pool's event loop for "async")."""
    kinds = {p[5] for p in read_ledger(ledger_dir) if p[0] == "start"}
    assert kinds == {kind}, kinds


@KINDS
def test_diamond(
    chain_app: App,
    chain_instance: Callable[..., Instance],
    ledger_dir: Path,
    database_url: str,
    kind: str,
) -> None:
    chain_instance(handler_env(kind))
    chain = Chain("diamond", args={"host": "db1"})
    a = chain.job("step", {"ms": 20, "n": 1}, key="a")
    b = chain.job("step", {"ms": 20, "n": 2}, key="b", after=[a])
    c = chain.job("step", {"ms": 20, "n": 3}, key="c", after=[a])
    chain.job("merge", {"expect": 2}, key="d", after=[b, c])
    request_id = chain_app.run_chain(chain)
    assert wait_final(chain_app, request_id) == "succeeded"
    st = chain_app.chain_status(request_id)
    assert st.args == {"host": "db1"}
    jobs = {j.key: j for j in st.jobs}
    assert jobs["d"].result == {"count": 2, "sum": 5}
    assert all(j.state == "succeeded" and j.try_ == 1 and j.total_tries == 1 for j in st.jobs)
    assert st.started_at is not None and st.finished_at is not None
    # Order: every job started after its predecessors ended (ledger, monotonic clock).
    lines = read_ledger(ledger_dir)
    t_start = {p[1].split(":")[1]: int(p[4]) for p in lines if p[0] == "start"}
    t_end = {p[1].split(":")[1]: int(p[5]) for p in lines if p[0] == "end"}
    assert t_start["b"] > t_end["a"] and t_start["c"] > t_end["a"]
    assert t_start["d"] > max(t_end["b"], t_end["c"])
    log = chain_app.job_log(request_id)
    assert sorted((e.key, e.try_, e.state) for e in log) == [
        ("a", 1, "succeeded"),
        ("b", 1, "succeeded"),
        ("c", 1, "succeeded"),
        ("d", 1, "succeeded"),
    ]
    assert all(e.duration_s is not None and e.duration_s >= 0 for e in log)
    assert_no_try_twice(ledger_dir)
    assert_ran_as(ledger_dir, kind)
    assert sql(database_url, "SELECT count(*) FROM hivejobs_job")[0][0] == 0


def test_fan_out_of_200_into_one_merge(
    chain_app: App, chain_instance: Callable[..., Instance], ledger_dir: Path
) -> None:
    chain_instance({"HJ_CHAIN_CONCURRENCY": "16"})
    chain = Chain("fan-out")
    root = chain.job("step", {}, key="root")
    leaves = [
        chain.job("step", {"ms": 5, "n": i}, key=f"leaf{i:03d}", after=[root]) for i in range(200)
    ]
    chain.job("merge", {"expect": 200}, key="merge", after=leaves)
    request_id = chain_app.run_chain(chain)
    assert wait_final(chain_app, request_id) == "succeeded"
    merged = {j.key: j for j in chain_app.chain_status(request_id).jobs}["merge"]
    assert merged.result == {"count": 200, "sum": sum(range(200))}
    assert len(chain_app.job_log(request_id)) == 202
    assert_no_try_twice(ledger_dir)


def sequence_chain(retries: int, fail_until: int) -> Chain:
    """prep -> [seq_a -> seq_b(flaky)] -> after; the sequence is retried as a whole."""
    chain = Chain("sequence")
    prep = chain.job("step", {}, key="prep")
    seq_a = chain.job("step", {}, key="seq_a", after=[prep])
    seq_b = chain.job("flaky", {"fail_until": fail_until}, key="seq_b", after=[seq_a])
    chain.job("step", {}, key="after", after=[seq_b])
    chain.sequence([seq_a, seq_b], retries=retries, retry_wait=0.2)
    return chain


@KINDS
def test_sequence_retried_as_a_whole_until_it_succeeds(
    chain_app: App, chain_instance: Callable[..., Instance], ledger_dir: Path, kind: str
) -> None:
    chain_instance(handler_env(kind))
    request_id = chain_app.run_chain(sequence_chain(retries=2, fail_until=2))
    assert wait_final(chain_app, request_id) == "succeeded"
    jobs = {j.key: j for j in chain_app.chain_status(request_id).jobs}
    # Spincycle's counts: `try` restarts with each sequence try, the total never does.
    assert (jobs["seq_b"].try_, jobs["seq_b"].total_tries, jobs["seq_b"].sequence_try) == (1, 3, 3)
    assert (jobs["seq_a"].try_, jobs["seq_a"].total_tries) == (1, 3)
    assert (jobs["prep"].total_tries, jobs["after"].total_tries) == (1, 1)
    assert jobs["seq_b"].result == "ok on try 3"
    log = [
        (e.key, e.try_, e.state, e.sequence_try)
        for e in chain_app.job_log(request_id)
        if e.key == "seq_b"
    ]
    assert log == [
        ("seq_b", 1, "failed", 1),
        ("seq_b", 2, "failed", 2),
        ("seq_b", 3, "succeeded", 3),
    ]
    assert_no_try_twice(ledger_dir)
    assert_ran_as(ledger_dir, kind)


def test_sequence_with_retries_exhausted_fails_the_chain(
    chain_app: App, chain_instance: Callable[..., Instance], ledger_dir: Path
) -> None:
    chain_instance()
    request_id = chain_app.run_chain(sequence_chain(retries=1, fail_until=5))
    assert wait_final(chain_app, request_id) == "failed"
    jobs = {j.key: j for j in chain_app.chain_status(request_id).jobs}
    assert jobs["seq_b"].state == "failed" and jobs["seq_b"].total_tries == 2
    assert "flaky failure on try 2" in (jobs["seq_b"].error or "")
    assert jobs["seq_a"].state == "succeeded"
    assert jobs["after"].state == "pending" and jobs["after"].total_tries == 0  # unreachable
    assert_no_try_twice(ledger_dir)


@KINDS
def test_stop_mid_chain(
    chain_app: App,
    chain_instance: Callable[..., Instance],
    ledger_dir: Path,
    database_url: str,
    kind: str,
) -> None:
    chain_instance(handler_env(kind))
    chain = Chain("stoppable")
    first = chain.job("step", {}, key="first")
    # At a gate never opened: the long jobs end only through the stop, however slow the test.
    longs = [chain.job("long", {"gate": "never"}, key=f"long{i}", after=[first]) for i in range(3)]
    chain.job("step", {}, key="last", after=longs)
    request_id = chain_app.run_chain(chain)
    wait_until(
        lambda: (
            sum(
                j.state == "running" and j.status is not None
                for j in chain_app.chain_status(request_id).jobs
            )
            == 3
        ),
        what="the long jobs running and reporting status",
    )
    assert chain_app.stop_chain(request_id) is True
    assert wait_final(chain_app, request_id, timeout=20) == "stopped"
    jobs = {j.key: j for j in chain_app.chain_status(request_id).jobs}
    assert all(jobs[f"long{i}"].state == "stopped" for i in range(3))
    assert all(jobs[f"long{i}"].try_ == 0 for i in range(3))  # a stop is not a try
    assert jobs["last"].state == "pending" and jobs["last"].total_tries == 0
    assert not any(p[1].split(":")[1] == "last" for p in read_ledger(ledger_dir))
    # The stop reached each running handler (an `async def` one as its task's cancellation).
    wait_until(
        lambda: (
            sorted(
                p[1].split(":")[1]
                for p in read_ledger(ledger_dir)
                if p[0] == "end" and p[3] == "interrupted"
            )
            == [f"long{i}" for i in range(3)]
        ),
        what="the long jobs interrupted",
    )
    assert_ran_as(ledger_dir, kind)
    assert chain_app.stop_chain(request_id) is False
    assert sql(database_url, "SELECT count(*) FROM hivejobs_job")[0][0] == 0


def pools_of(url: str, supervisor_pid: int) -> list[int]:
    rows = sql(url, "SELECT pid FROM hivejobs_worker WHERE role = 'pool'")
    return [r[0] for r in rows if alive(r[0]) and _ppid(r[0]) == supervisor_pid]


def _ppid(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].split()[1])
    except (FileNotFoundError, IndexError, ValueError):
        return -1


@KINDS
def test_sigterm_suspends_chain_and_another_instance_resumes_it(
    chain_app: App,
    chain_instance: Callable[..., Instance],
    ledger_dir: Path,
    database_url: str,
    kind: str,
) -> None:
    # On Heroku (DYNO set) a repeated SIGTERM changes nothing (R10), so A's pools ask their
    # handlers to stop at the soft deadline (shutdown timeout less the stop grace) and wait for
    # them; elsewhere a second SIGTERM means "suspend now", without waiting.
    heroku = {"DYNO": "worker.1", "HIVEJOBS_SHUTDOWN_TIMEOUT_S": "8"}
    a = chain_instance(handler_env(kind) | heroku)
    chain = Chain("rolling-restart")
    first = chain.job("step", {}, key="first")
    # The long jobs wait at a gate opened only once A has exited: A's tries are always
    # interrupted and B's always resume them, however long B takes to start.
    longs = [
        chain.job("long", {"gate": "longs"}, key=f"long{i}", after=[first], tries=2)
        for i in range(3)
    ]
    chain.job("step", {}, key="last", after=longs)
    request_id = chain_app.run_chain(chain)
    wait_until(
        lambda: (
            sum(
                j.state == "running" and j.status is not None
                for j in chain_app.chain_status(request_id).jobs
            )
            == 3
        ),
        what="the long jobs running on instance A",
    )
    b = chain_instance(handler_env(kind))
    types = len(chain_app.types)  # a pool per job type of the chain app
    wait_until(lambda: len(pools_of(database_url, b.pid)) == types, what="instance B's pools")
    a.signal_group(signal.SIGTERM)
    a.signal_group(signal.SIGTERM)  # Heroku may send several: no escalation (R10)
    assert a.wait(15) == 0
    open_gate(chain_app.connections.broker, "longs")
    final = wait_final(chain_app, request_id, timeout=40)
    st = chain_app.chain_status(request_id)
    if final != "succeeded":
        for j in st.jobs:
            print("JOB", j.key, j.state, j.try_, j.total_tries, j.job_id, (j.error or "")[-300:])
        for e in chain_app.job_log(request_id):
            print("LOG", e.key, e.try_, e.state, e.job_id, (e.error or "")[-300:])
    assert final == "succeeded"
    assert st.suspensions >= 1 and st.resumed_at is not None
    jobs = {j.key: j for j in st.jobs}
    for i in range(3):
        job = jobs[f"long{i}"]
        # The interrupted try is not counted; the total (job-log try number) moved on.
        assert (job.state, job.try_, job.total_tries) == ("succeeded", 1, 2)
    log = [
        (e.key, e.try_, e.state) for e in chain_app.job_log(request_id) if e.key.startswith("long")
    ]
    assert sorted(log) == sorted(
        [(f"long{i}", 1, "stopped") for i in range(3)]
        + [(f"long{i}", 2, "succeeded") for i in range(3)]
    )
    # The resumed tries ran on B, after A had exited.
    b_pools = set(pools_of(database_url, b.pid))
    resumed = [
        p
        for p in read_ledger(ledger_dir)
        if p[0] == "start" and p[1].endswith(":2") and p[1].split(":")[1] != "first"
    ]
    assert len(resumed) == 3 and all(int(p[3]) in b_pools for p in resumed)
    # A's tries ended through the stop (an `async def` handler's as its task's cancellation).
    interrupted = [
        p[1].split(":")[1]
        for p in read_ledger(ledger_dir)
        if p[0] == "end" and p[3] == "interrupted"
    ]
    assert sorted(interrupted) == [f"long{i}" for i in range(3)]
    assert_no_try_twice(ledger_dir)
    assert_ran_as(ledger_dir, kind)
    assert sql(database_url, "SELECT count(*) FROM hivejobs_job")[0][0] == 0


def leader_coordinator_pid(url: str) -> int | None:
    rows = sql(
        url,
        "SELECT w.pid FROM hivejobs_leader l JOIN hivejobs_worker w "
        "ON w.id = l.holder WHERE l.expires_at > now()",
    )
    return rows[0][0] if rows and alive(rows[0][0]) else None


def stalled_transaction(url: str) -> bool:
    """A coordinator parked at the failpoint: its transaction idles for a while."""
    return bool(
        sql(
            url,
            "SELECT 1 FROM pg_stat_activity WHERE datname = current_database() "
            "AND state = 'idle in transaction' "
            "AND state_change < now() - interval '0.5 s'",
        )
    )


def test_kill_9_of_the_coordinator_mid_traversal_loses_nothing(
    chain_app: App,
    chain_instance: Callable[..., Instance],
    ledger_dir: Path,
    database_url: str,
) -> None:
    # The leader parks right after reaping the root's success, before the 200 successors
    # are enqueued; we kill -9 it there. Its supervisor restarts it as a new coordinator.
    chain_instance(
        {
            "HJ_CHAIN_CONCURRENCY": "16",
            "HIVEJOBS_FAILPOINTS": "chain.after_success_before_successor=sleep:3",
        }
    )
    leader = wait_until(lambda: leader_coordinator_pid(database_url), what="a leader")
    chain = Chain("fan-out-kill")
    root = chain.job("step", {}, key="root")
    leaves = [
        chain.job("step", {"ms": 5, "n": i}, key=f"leaf{i:03d}", after=[root]) for i in range(200)
    ]
    chain.job("merge", {"expect": 200}, key="merge", after=leaves)
    request_id = chain_app.run_chain(chain)
    wait_until(lambda: stalled_transaction(database_url), what="the leader at the failpoint")
    os.kill(leader, signal.SIGKILL)
    assert wait_final(chain_app, request_id, timeout=50) == "succeeded"
    assert leader_coordinator_pid(database_url) != leader
    merged = {j.key: j for j in chain_app.chain_status(request_id).jobs}["merge"]
    assert merged.result == {"count": 200, "sum": sum(range(200))}
    starts = ledger_starts(ledger_dir)
    assert len(starts) == 202  # root, 200 leaves, merge: one try each
    assert_no_try_twice(ledger_dir)
    assert all(e.try_ == 1 for e in chain_app.job_log(request_id))
