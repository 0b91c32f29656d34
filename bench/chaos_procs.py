"""Chaos scenarios that hurt `hivejobs run` processes (RELIABILITY.md S8 poison jobs, S13
supervisor and instance kills, S16 the failpoint matrix)."""

from __future__ import annotations

import os
import signal
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from bench.chaoslib import Row, Scenario, error_row, scaled
from bench.harness import (
    alive,
    ledger_starts,
    pool_pids,
    running_in_pid,
    sql,
    wait_until,
)

from hivejobs import App, Chain, failpoints

# -- S8 --------------------------------------------------------------------------------

POISONS = {
    "s8_raise": "raise",
    "s8_segfault": "segfault",
    "s8_exit": "exit",
    "s8_oom": "oom",
    "s8_hang": "hang",
    "s8_gil_hog": "gil_hog",
    # `async def` handlers: a hang's timeout cancels its task; a hog or a segfault of the loop
    # is the process's, as with a def handler's.
    "s8_async_raise": "raise",
    "s8_async_exit": "exit",
    "s8_async_hang": "hang",
}


End = tuple[str, int, str]  # (state, attempt, last line of the error)
GIL_HOG_ENDS = ("timed out after", "worker lost", "interrupted by shutdown")


def _ends_as(action: str) -> Callable[[End], bool]:
    """The expected end of each poison (RELIABILITY S8)."""
    checks: dict[str, Callable[[End], bool]] = {
        "raise": lambda f: f == ("failed", 3, "ValueError: poison raised"),
        "segfault": lambda f: f[0] == "failed" and "poison pill" in f[2],
        "exit": lambda f: f[:3] == ("failed", 1, "worker lost"),
        "oom": lambda f: f[0] == "failed" and ("MemoryError" in f[2] or "worker lost" in f[2]),
        "hang": lambda f: f == ("failed", 1, "timed out after 2s"),
        # At-most-once: a hog still running when its pool recycles for another hog's timeout
        # is a straggler of that drain, failed "interrupted by shutdown" and never run again.
        "gil_hog": lambda f: f[0] == "failed" and f[2].startswith(GIL_HOG_ENDS),
    }
    return checks[action]


def poison(scale: float, segfaults: int | None = None) -> Row:
    """S8: each poison type shares its pool with normal 10 ms jobs; an unpoisoned pool runs
    alongside. Poisons end as planned, normal jobs succeed (at-most-once ones may end
    "worker lost" with their process, never start twice), the supervisor stays up."""
    s = Scenario("S8 poison jobs")
    try:
        inst = s.instance(",".join([*POISONS, "alo"]))
        app = s.app([*POISONS, "alo"])
        each = scaled(10, scale, 3)
        normal = scaled(10_000, scale, 60) // (len(POISONS) + 1)
        alo: list[str] = app.enqueue_many("alo", [{"ms": 10}] * normal)
        amo: list[str] = []
        expected = {}
        once_only: list[str] = []  # at-most-once poisons: never started twice
        for name, action in POISONS.items():
            at_most_once = app.job_type(name).delivery == "at_most_once"
            ids = app.enqueue_many(name, [{"do": "ok"}] * (normal // 2))
            # K deaths per segfault job, each restart backoff doubling from 0.5 s (capped at
            # 30 s): 3 of them keep that pool down ~90 s, so CI may ask for fewer.
            count = min(each, segfaults or 3) if action == "segfault" else each
            for _ in range(count):
                job_id = app.enqueue(name, {"do": action, "s": 20})
                expected[job_id] = _ends_as(action)
                if at_most_once:
                    once_only.append(job_id)
            ids += app.enqueue_many(name, [{"do": "ok"}] * (normal - normal // 2))
            (amo if at_most_once else alo).extend(ids)
        row = s.result(alo=alo, amo=amo, expected=expected, timeout=300, dead_are_killed=True)
        final, starts = s.archived(), ledger_starts(s.ledger)
        # Normal at-most-once jobs that shared a process with an exit end "worker lost";
        # in the recycled gil_hog pool they may end "interrupted by shutdown", or "timed out"
        # when the hog held the GIL past their own 2 s timeout (no thread can preempt it).
        amo_ends = ("worker lost", "interrupted by shutdown", "timed out after")
        odd = [
            final[i]
            for i in amo
            if final[i][0] != "succeeded" and not (final[i][2] or "").startswith(amo_ends)
        ]
        s.check(not odd, f"{len(odd)} normal amo jobs ended {odd[:2]}")
        twice = [i for i in once_only if starts[i] > 1]
        s.check(not twice, f"{len(twice)} at-most-once poisons started twice")
        s.check(inst.proc.poll() is None, "the supervisor exited")
        restarts = inst.log_text().count("child died")
        notes = f"{each} of each poison ({min(each, segfaults or 3)} segfault), {restarts} restarts"
        return s.rejudge(row, twice=len(twice), notes=notes)
    finally:
        s.close()


# -- S13 -------------------------------------------------------------------------------


def _instance_pids(url: str, host: int) -> list[int]:
    rows = sql(url, "SELECT pid FROM hivejobs_worker")
    return [int(r[0]) for r in rows if _parent(int(r[0])) == host]


def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].split()[1])
    except (FileNotFoundError, IndexError, ValueError):
        return -1


def kill_instance(scale: float) -> Row:
    """S13: (a) kill -9 of A's supervisor alone: its children exit within 2 s and B rescues
    their claims after stuck_after; (b) killpg(A, SIGKILL), host death: B rescues."""
    s = Scenario("S13 kill supervisor / instance")
    try:
        types = ["alo", "amo", "alo_async"]
        b = s.instance(",".join(types), HJ_CONCURRENCY_AMO="4")
        app = s.app(types)
        n = scaled(5000, scale, 100) // 2  # per round
        alo: list[str] = []
        amo: list[str] = []
        stuck = float(app.settings.stuck_after_s)
        for how in ("supervisor", "instance"):
            a = s.instance(",".join(types), HJ_CONCURRENCY_AMO="4")
            wait_until(lambda h=a.pid: len(_instance_pids(s.url, h)) == 4, timeout=60, what="A")
            pids = _instance_pids(s.url, a.pid)
            alo += app.enqueue_many("alo", [{"ms": 100}] * (n * 2 // 5))
            alo += app.enqueue_many("alo_async", [{"ms": 100}] * (n * 2 // 5))
            amo += app.enqueue_many("amo", [{"ms": 100}] * (n // 5))
            wait_until(
                lambda ps=pids: sum(len(running_in_pid(s.ledger, p)) for p in ps) >= 6,
                timeout=60,
                what="A mid-run",
            )
            worker_ids = [
                r[0]
                for r in sql(s.url, "SELECT id FROM hivejobs_worker WHERE pid = ANY(%s)", (pids,))
            ]
            if how == "supervisor":
                s.kill(a.pid)
            else:
                a.signal_group(signal.SIGKILL)
            s.killed |= set(pids)
            at = time.monotonic()
            wait_until(lambda ps=pids: not [p for p in ps if alive(p)], timeout=10, what="A gone")
            gone = time.monotonic() - at
            s.check(how != "supervisor" or gone <= 2.0, f"A's children lived {gone:.1f} s")
            took = s.recovery(
                at,
                lambda w=worker_ids: (
                    not sql(
                        s.url,
                        "SELECT 1 FROM hivejobs_job WHERE worker_id = ANY(%s::uuid[])",
                        (w,),
                    )
                ),
                "A's claims rescued",
            )
            # Rescue after stuck_after, plus the lease when A held it (B takes it first).
            bound = stuck + 2 + float(app.settings.lease_ttl_s) + 2
            s.check(took <= bound, f"{how}: rescue took {took:.1f} s > {bound:.0f} s")
        row = s.result(alo=alo, amo=amo, timeout=300)
        s.check(b.proc.poll() is None, "B's supervisor exited")
        lost = sum(1 for i in amo if s.archived()[i][2] == "worker lost")
        return s.rejudge(row, notes=f"{lost} amo failed 'worker lost'")
    finally:
        s.close()


# -- S16 -------------------------------------------------------------------------------

# name -> (n-th hit that fires, the trigger that makes the code path run)
FAILPOINTS: dict[str, tuple[int, str]] = {
    "enqueue.after_commit_before_push": (50, "client"),
    # One hit per claim statement (up to 64 ids each) or per completion batch: not @50.
    "pool.after_claim_commit": (5, "jobs"),
    "pool.before_completion_commit": (50, "jobs"),
    "pool.completion_commit_raises": (5, "jobs"),
    "pool.after_suspend_write_before_exit": (1, "sigterm"),
    "coord.after_lease_before_action": (10, "jobs"),
    "coord.mid_reconcile_batch": (1, "reconcile"),
    "coord.mid_rescue_batch": (1, "rescue"),
    "chain.after_success_before_successor": (2, "chain"),
    "chain.after_commit_before_push": (2, "chain"),
    "chain.mid_resume": (1, "sigterm"),
}
# In the plan but not added: in hivejobs a completion moves the row to the archive in the
# same statement (archive_finished_if_running), so "after complete, before archive" has no
# window; a chain try's suspension is written inside Store.finish's transaction, and store/
# imports nothing of ours but records, errors and config.
NOT_APPLICABLE = ("pool.after_complete_before_archive", "chain.mid_suspend")
ACTIONS = ("exit", "raise", "sleep:6")


def failpoint_matrix(scale: float, actions: tuple[str, ...] = ACTIONS) -> list[Row]:
    """S16 chaos: each failpoint x action in a run of its own (500 jobs, and its trigger)."""
    rows = []
    for action in actions:
        for name in FAILPOINTS:
            try:
                rows.append(failpoint_cell([name], action, scale))
            except Exception as exc:  # noqa: BLE001 - one cell's failure is its row
                rows.append(error_row(f"S16 {name} {action}", exc))
            print(rows[-1], file=sys.stderr, flush=True)  # progress: a cell takes ~10-60 s
    return rows


def failpoint_cell(names: list[str], action: str, scale: float) -> Row:
    """One run with `names` armed with `action` (each fires once across the fleet): 500 10 ms
    jobs and, as the failpoints need, a chain, a Redis boot-marker loss, a dead worker's
    claim, a SIGTERM handover to a second instance. Nothing may be lost or run twice."""
    label = names[0] if len(names) == 1 else f"{len(names)} failpoints"
    s = Scenario(f"S16 {label} {action}")
    triggers = {FAILPOINTS[n][1] for n in names}
    spec = ",".join(
        f"{n}={action}@{FAILPOINTS[n][0]}" for n in names if FAILPOINTS[n][1] != "client"
    )
    once = s.tmp / "fired"
    once.mkdir()
    env = {"HIVEJOBS_FAILPOINTS": spec, "HIVEJOBS_FAILPOINTS_ONCE_DIR": str(once)}
    types = "alo,long_coop"
    try:
        s.instance(types, **env)
        app = s.app(["alo", "long_coop"])
        ids = app.enqueue_many("alo", [{"ms": 10}] * scaled(500, scale, 100))
        chains = []
        if triggers & {"chain", "sigterm"}:
            chains.append(_chain(app, long=False))
        if "sigterm" in triggers:
            chains.append(_chain(app, long=True))
        if "client" in triggers:
            ids += _client_failpoint(app, action, once)
        if "rescue" in triggers:
            ids.append(_dead_workers_claim(s.url, app))
        if "reconcile" in triggers:
            # As a flush of this prefix while jobs are queued: the reconciler restores only
            # lists that are empty, so the list goes with the boot marker.
            app.connections.broker.redis.delete(
                app.connections.broker.boot_key, app.connections.broker.queue_key("alo", 0)
            )
        if "sigterm" in triggers:
            first = s.instances[0]
            wait_until(
                lambda: any(
                    running_in_pid(s.ledger, p) for p in pool_pids(s.url, "long_coop", first.pid)
                ),
                timeout=60,
                what="a long chain job running",
            )
            s.instance(types, **env)
            wait_until(lambda: len(pool_pids(s.url, "alo")) >= 2, timeout=60, what="instance B")
            first.signal_group(signal.SIGTERM)
            at = time.monotonic()
            s.check(first.wait(20) == 0, "A did not exit 0 on SIGTERM")
            s.recoveries.append(time.monotonic() - at)  # SIGTERM -> A gone
        wanted = {n for n in names if FAILPOINTS[n][1] != "client"}
        try:
            wait_until(lambda: wanted <= {p.name for p in once.iterdir()}, timeout=60)
        except AssertionError:
            s.problems.append(f"never fired: {sorted(wanted - {p.name for p in once.iterdir()})}")
        fired = time.monotonic()
        row = s.result(alo=ids, timeout=180, dead_are_killed=True)
        s.recoveries.append(time.monotonic() - fired)  # fired -> everything terminal
        row["recovery_s"] = round(max(s.recoveries), 1)
        for request_id in chains:
            state = _chain_final(app, request_id)
            s.check(state == "succeeded", f"chain {request_id} ended {state}")
        tries = ledger_starts(s.ledger)
        chain_twice = [k for k, v in tries.items() if ":" in k and v > 1]
        s.check(not chain_twice, f"chain tries started twice: {chain_twice[:3]}")
        return s.rejudge(row, notes=f"fired: {len(list(once.iterdir()))}/{len(names)}")
    finally:
        s.close()


def _chain_final(app: App, request_id: str, timeout: float = 60) -> str:
    """The chain's final state, or "<state> after <timeout> s" if it never got there."""
    final = ("succeeded", "failed", "stopped")
    try:
        state: str = wait_until(
            lambda: (st := app.chain_status(request_id).state) in final and st,
            timeout=timeout,
            interval=0.2,
            what="chain final",
        )
    except AssertionError:
        return f"{app.chain_status(request_id).state} after {timeout:.0f} s"
    return state


def _chain(app: App, long: bool) -> str:
    chain = Chain(f"s16-{'long' if long else 'short'}")
    if long:
        first = chain.job("long_coop", {"s": 12}, key="first")
    else:
        first = chain.job("alo", {"ms": 10}, key="first")
    leaves = [chain.job("alo", {"ms": 10}, key=f"leaf{i}", after=[first]) for i in range(20)]
    chain.job("alo", {"ms": 10}, key="merge", after=leaves)
    return app.run_chain(chain)


def _client_failpoint(app: App, action: str, once: Path) -> list[str]:
    """enqueue.after_commit_before_push fires in this process: the call fails (or stalls)
    after the commit, the job is stored and must still run (reconciler, R1)."""
    saved = {k: os.environ.get(k) for k in ("HIVEJOBS_TESTING", "HIVEJOBS_FAILPOINTS")}
    name = "enqueue.after_commit_before_push"
    if action == "exit":
        action = "raise"  # os._exit here would end the chaos run itself
    os.environ.update(
        {"HIVEJOBS_TESTING": "1", "HIVEJOBS_FAILPOINTS": f"{name}={action}@{FAILPOINTS[name][0]}"}
    )
    failpoints.reload()
    ids = []
    try:
        for i in range(60):
            job_id = f"client-{i}"
            try:
                ids.append(app.enqueue("alo", {"ms": 1}, id=job_id))
            except RuntimeError:
                ids.append(job_id)  # committed before the failure: it must run anyway
                (once / name).touch()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        failpoints.reload()
    if action.startswith("sleep"):
        (once / name).touch()
    return ids


def _dead_workers_claim(url: str, app: App) -> str:
    """A claim held by a worker row whose heartbeat is an hour old: the rescuer's work."""
    worker = str(uuid.uuid4())
    job_id = app.enqueue("alo", {"ms": 1}, delay=3600)
    sql(
        url,
        "INSERT INTO hivejobs_worker (id, host, pid, role, pool, started_at, heartbeat_at)"
        " VALUES (%s, 'gone', 0, 'pool', 'alo', now() - interval '1 hour',"
        " now() - interval '1 hour')",
        (worker,),
    )
    sql(
        url,
        "UPDATE hivejobs_job SET state = 'running', attempt = 1, worker_id = %s,"
        " claim_token = 1, started_at = now() WHERE id = %s",
        (worker, job_id),
    )
    return job_id
