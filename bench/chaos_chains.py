"""Chaos scenario S14 (RELIABILITY.md): the leader's coordinator killed at chain traversal
points (after a success before the successors, mid-resume, right after stop_chain)."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from bench.chaoslib import Row, Scenario, leader
from bench.harness import ledger_starts, pool_pids, wait_until

from hivejobs import App, Chain

# -- S14 -------------------------------------------------------------------------------


def chain_coordinator_faults(scale: float) -> Row:
    """S14: 200-job fan-outs into a merge job; the leader's coordinator is killed -9 (1) right
    after a fan-out job succeeded, before its successors are enqueued, (2) mid-resume of a
    suspended chain, (3) right after stop_chain. No try starts twice, every merge reads all
    200 results, the resume is finished by the next leader, a stopped chain stays stopped."""
    s = Scenario("S14 chain coordinator faults")
    once = s.tmp / "fired"
    once.mkdir()
    arm = {
        "HIVEJOBS_FAILPOINTS": "chain.after_success_before_successor=sleep:3,"
        "chain.mid_resume=sleep:3",
        "HIVEJOBS_FAILPOINTS_ONCE_DIR": str(once),
        "HJ_CHAIN_CONCURRENCY": "16",
    }
    spec = "tests.apps.chainapp:app"
    try:
        a = s.instance("", app_spec=spec, **arm)
        app = _chain_app(s)
        n_chains = max(1, round(5 * scale))
        fans = [app.run_chain(_fan_out(f"fan{i}", 200)) for i in range(n_chains)]
        # (1) the leader parks after a success, before the successors: kill it there.
        _kill_leader_at(s, once / "chain.after_success_before_successor")
        # (2) a chain of long jobs suspended by SIGTERM; B resumes it and is killed mid-resume.
        # Its long jobs hold at a gate opened after that kill: a fixed duration could end
        # them before the SIGTERM on a slow machine, leaving nothing to suspend or resume.
        long_chain = app.run_chain(_long_chain("s14-resumed"))
        wait_until(
            lambda: _running_keys(app, long_chain) >= 2, timeout=60, what="long jobs running"
        )
        s.instance("", app_spec=spec, **arm)
        wait_until(lambda: len(pool_pids(s.url, "long")) == 2, timeout=60, what="B up")
        a.signal_group(signal.SIGTERM)
        s.check(a.wait(20) == 0, "A did not exit 0")
        _kill_leader_at(s, once / "chain.mid_resume")
        _open_gate(app, "s14-resumed")
        # (3) stop a chain and kill the leader right away (its gate is never opened).
        stopped = app.run_chain(_long_chain("s14-stopped"))
        wait_until(lambda: _running_keys(app, stopped) >= 1, timeout=60, what="stopped runs")
        app.stop_chain(stopped)
        at = time.monotonic()
        pid = wait_until(lambda: leader(s.url)[0], what="a leader")
        s.kill(pid)
        s.recovery(at, lambda: leader(s.url)[0] not in (0, pid), "a new leader")
        finals = {r: _wait_chain(app, r) for r in [*fans, long_chain, stopped]}
        for request_id in fans:
            s.check(finals[request_id] == "succeeded", f"{request_id} ended {finals[request_id]}")
            merged = {j.key: j for j in app.chain_status(request_id).jobs}["merge"]
            s.check(
                merged.result == {"count": 200, "sum": sum(range(200))},
                f"merge read {merged.result}",
            )
        s.check(finals[long_chain] == "succeeded", f"resumed chain ended {finals[long_chain]}")
        s.check(finals[stopped] == "stopped", f"stopped chain ended {finals[stopped]}")
        after_stop = [j.key for j in app.chain_status(stopped).jobs if j.state == "succeeded"]
        s.check(not [k for k in after_stop if k != "first"], f"ran after stop: {after_stop}")
        twice = {k: v for k, v in ledger_starts(s.ledger).items() if v > 1}
        s.check(not twice, f"chain tries started twice: {list(twice)[:3]}")
        row = {
            "scenario": s.name,
            "jobs": n_chains * 202 + 8,
            "lost": sum(1 for st in finals.values() if st not in ("succeeded", "stopped")),
            "twice": len(twice),
            "rescued": "-",
            "recovery_s": round(max(s.recoveries), 1),
            "time_s": round(time.monotonic() - s.started, 1),
            "result": "",
            "notes": "",
        }
        return s.rejudge(row, notes=f"{n_chains} fan-outs of 200, 2 long chains")
    finally:
        s.close()


def _chain_app(s: Scenario) -> App:
    from tests.apps.chainapp import app as declared

    app = App(database_url=s.url, redis_url=s.redis_url, prefix=s.prefix)
    app.types.update(declared.types)
    wait_until(lambda: pool_pids(s.url, "step"), timeout=60, what="chain pools")
    s.apps.append(app)
    return app


def _fan_out(name: str, width: int) -> Chain:
    chain = Chain(name)
    root = chain.job("step", {}, key="root")
    leaves = [
        chain.job("step", {"ms": 5, "n": i}, key=f"leaf{i:03d}", after=[root]) for i in range(width)
    ]
    chain.job("merge", {"expect": width}, key="merge", after=leaves)
    return chain


def _long_chain(gate: str) -> Chain:
    chain = Chain("long")
    first = chain.job("step", {"ms": 10}, key="first")
    longs = [chain.job("long", {"gate": gate}, key=f"long{i}", after=[first]) for i in range(3)]
    chain.job("step", {"ms": 10}, key="last", after=longs)
    return chain


def _open_gate(app: App, name: str) -> None:
    from tests.apps.gate import open_gate

    open_gate(app.connections.broker, name)


def _running_keys(app: App, request_id: str) -> int:
    return sum(1 for j in app.chain_status(request_id).jobs if j.state == "running")


def _kill_leader_at(s: Scenario, marker: Path) -> None:
    """Wait for the leader to park at a sleeping failpoint, kill -9 it, time the takeover."""
    wait_until(marker.exists, timeout=60, what=marker.name)
    pid: int = wait_until(lambda: leader(s.url)[0], what="a leader")
    at = time.monotonic()
    s.kill(pid)
    s.recovery(at, lambda: leader(s.url)[0] not in (0, pid), f"takeover after {marker.name}")


def _wait_chain(app: App, request_id: str) -> str:
    final = ("succeeded", "failed", "stopped")
    state: str = wait_until(
        lambda: (st := app.chain_status(request_id).state) in final and st,
        timeout=180,
        interval=0.5,
        what=f"chain {request_id}",
    )
    return state
