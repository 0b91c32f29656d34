"""Fan-out from a running chain job (ctx.chain.add) on real `hivejobs run` instances.

A job adds 500 jobs and a join after them below itself, the join holding back a declared
successor; the added jobs read an ancestor two levels up. Then kill -9 of the pool between
two adds of one job: its next try adds only what the killed one had not, so every added job
exists and runs once. Waits poll Postgres with a deadline; the ledger proves no try ran twice.
The 10,000-job fan-out is measured by bench/fanout.py.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

from hivejobs import App, Chain
from tests.harness import Instance, read_ledger, sql, wait_until
from tests.process.test_chain_operations import cli
from tests.process.test_chain_run import assert_no_try_twice, wait_final


def test_fan_out_of_500_with_a_join_reading_an_ancestor(
    chain_app: App,
    chain_instance: Callable[..., Instance],
    ledger_dir: Path,
    instance_env: dict[str, str],
) -> None:
    chain_instance({"HJ_CHAIN_CONCURRENCY": "16"})
    chain = Chain("scan-files")
    root = chain.job("step", {"n": 7}, key="root")
    scan = chain.job(
        "fanout", {"n": 500, "root": "root", "before": ["report"]}, key="scan", after=[root]
    )
    chain.job("step", {}, key="report", after=[scan])
    request_id = chain_app.run_chain(chain)
    assert wait_final(chain_app, request_id, timeout=90) == "succeeded"

    jobs = {j.key: j for j in chain_app.chain_status(request_id).jobs}
    leaves = {f"scan.{i + 1}" for i in range(500)}
    assert set(jobs) == {"root", "scan", "report", "scan.join"} | leaves
    assert all(j.state == "succeeded" and j.total_tries == 1 for j in jobs.values())
    assert {jobs[k].added_by for k in [*leaves, "scan.join"]} == {"scan"}
    # Every added job read the root's result, two levels up (its parent is scan).
    wrong = [
        k
        for k in leaves
        if jobs[k].result != {"key": k, "n": int(k[5:]) - 1, "root": {"key": "root", "n": 7}}
    ]
    assert not wrong, [jobs[k].result for k in wrong[:3]]
    assert jobs["scan.join"].result == {"count": 500, "sum": sum(range(500))}
    assert jobs["report"].after == ["scan", "scan.join"]
    lines = read_ledger(ledger_dir)
    t_start = {p[1].split(":")[1]: int(p[4]) for p in lines if p[0] == "start"}
    t_end = {p[1].split(":")[1]: int(p[5]) for p in lines if p[0] == "end"}
    assert t_start["report"] > t_end["scan.join"] > max(t_end[k] for k in leaves)
    assert len(chain_app.job_log(request_id)) == 504
    assert chain_app.list_chains()[0].jobs == 504
    assert_no_try_twice(ledger_dir)

    env = {**instance_env, "HIVEJOBS_APP": "tests.apps.chainapp:app"}
    shown = cli(env, "chain", "status", request_id)
    assert shown.returncode == 0, shown.stderr
    join = next(line for line in shown.stdout.splitlines() if " scan.join " in line)
    assert "succeeded" in join and "(added by scan)" in join, shown.stdout
    assert "jobs: 504 succeeded" in shown.stdout


def test_kill_9_of_the_pool_between_two_adds_doubles_and_loses_nothing(
    chain_app: App,
    chain_instance: Callable[..., Instance],
    ledger_dir: Path,
    database_url: str,
) -> None:
    chain_instance()
    chain = Chain("killed-scan")
    scan = chain.job(
        "fanout", {"n": 60, "parts": 2, "gate": "never", "before": ["report"]}, key="scan", tries=2
    )
    chain.job("step", {}, key="report", after=[scan])
    request_id = chain_app.run_chain(chain)
    # The first try stored its first 30 jobs and waits at a gate nobody opens: kill its pool.
    added: list[str] = wait_until(
        lambda: next((p for p in read_ledger(ledger_dir) if p[0] == "added"), None),
        timeout=30,
        what="the first add",
    )
    assert added[1].endswith(":scan:1") and added[2:4] == ["0", "30"]
    os.kill(int(added[4]), signal.SIGKILL)
    assert wait_final(chain_app, request_id, timeout=60) == "succeeded"

    adds = [
        (p[1].rsplit(":", 1)[1], p[2], p[3]) for p in read_ledger(ledger_dir) if p[0] == "added"
    ]
    assert sorted(adds) == [("1", "0", "30"), ("2", "0", "0"), ("2", "1", "31")]
    jobs = {j.key: j for j in chain_app.chain_status(request_id).jobs}
    assert sorted(jobs) == sorted(
        ["scan", "report", "scan.join", *(f"scan.{i + 1}" for i in range(60))]
    )
    assert all(j.state == "succeeded" for j in jobs.values())
    assert jobs["scan.join"].result == {"count": 60, "sum": sum(range(60))}
    assert jobs["report"].after == ["scan", "scan.join"]
    log = sorted((e.try_, e.state) for e in chain_app.job_log(request_id) if e.key == "scan")
    assert log == [(1, "failed"), (2, "succeeded")]
    stored = sql(database_url, "SELECT jobs FROM hivejobs_chain WHERE id = %s", (request_id,))
    assert stored == [(63,)]
    assert_no_try_twice(ledger_dir)
