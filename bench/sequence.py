"""Sequences per key at full size: KEYS keys x PER_KEY jobs of random durations through two
`hivejobs run` instances, first calm, then with kill -9 of a pool every KILL_EVERY_S seconds
and a rolling restart (each instance replaced in turn: a new one starts, the old one gets
SIGTERM). Checked by bench/sequence_check.py from the archive and from the handlers' ledger:
per key the starts are in enqueue order, never two runs at once, 0 lost.

    PYTHONPATH=src:. python bench/sequence.py [--keys 20] [--per-key 500] [--out FILE]

Job body: tests/apps/sequenceapp.py `ordered` (4 runners per pool process), sleeping the
payload's 1-20 ms and writing two ledger lines. The numbers: wall time, jobs/s, and the
hand-over gap per key (from one job's finished_at to the next one's started_at, both on the
database clock; each includes the completion batch, the trigger's NOTIFY, the coordinator's
push and the next pop and claim).
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.chaoslib import Scenario  # noqa: E402
from bench.harness import pool_pids, sql, wait_until  # noqa: E402
from bench.sequence_check import Report, check  # noqa: E402

APP = "tests.apps.sequenceapp:app"
GAPS = """
SELECT extract(epoch FROM started_at - lag(finished_at) OVER (PARTITION BY seq_key ORDER BY
       started_at)) * 1000
  FROM (SELECT a.started_at, a.finished_at, convert_from(a.payload, 'UTF8')::jsonb ->> 'account'
               AS seq_key
          FROM hivejobs_archive a WHERE a.name = 'ordered') x
"""


def enqueue(sc: Scenario, name: str, keys: int, per_key: int, seed: int) -> dict[str, list[str]]:
    """Round by round, every key's next job in one enqueue_many (its order is the key's)."""
    app = sc.app([name])
    rng = random.Random(seed)
    lines: dict[str, list[str]] = {f"k{k}": [] for k in range(keys)}
    for i in range(per_key):
        batch = [{"account": a, "i": i, "ms": rng.randint(1, 20)} for a in lines]
        for account, job_id in zip(lines, app.enqueue_many(name, batch), strict=True):
            lines[account].append(job_id)
    return lines


def kill_a_pool(sc: Scenario, rng: random.Random, dead: dict[int, int]) -> bool:
    pids = pool_pids(sc.url, "ordered")
    if not pids:
        return False
    victim = rng.choice(pids)
    sc.kill(victim)
    # SIGKILL is delivered before kill() returns to us: no handler line of the victim can
    # come after this instant (noted later, a re-run elsewhere would look like an overlap).
    dead[victim] = time.monotonic_ns()
    wait_until(lambda: victim not in pool_pids(sc.url, "ordered"), what="the pool gone")
    return True


def replace(sc: Scenario, old_index: int, dead: dict[int, int]) -> None:
    """One step of a rolling restart: a new instance up, then SIGTERM to the old one."""
    old = sc.instances[old_index]
    before = len(pool_pids(sc.url, "ordered"))
    sc.instance("", app_spec=APP, HJ_SEQ_BASELINE="1")
    wait_until(lambda: len(pool_pids(sc.url, "ordered")) > before, timeout=60, what="new pool")
    leaving = [p for p in pool_pids(sc.url, "ordered", host_pid=old.pid)]
    old.signal_group(signal.SIGTERM)
    old.wait(60)
    for pid in leaving:
        dead[pid] = time.monotonic_ns()


def baseline(keys: int, per_key: int, seed: int) -> dict[str, object]:
    """The same jobs of the same body, unsequenced, calm: what the machine does without."""
    sc = Scenario("unsequenced-calm")
    try:
        for _ in range(2):
            sc.instance("", app_spec=APP, HJ_SEQ_BASELINE="1")
        enqueue(sc, "unordered", keys, per_key, seed)
        wait_until(lambda: sc.live() == 0, timeout=900, interval=0.2, what="every job done")
        span = "SELECT extract(epoch FROM max(finished_at) - min(started_at)) FROM hivejobs_archive"
        wall_s = float(sql(sc.url, span)[0][0])
        return {
            "scenario": sc.name,
            "keys": keys,
            "jobs": keys * per_key,
            "wall_s": round(wall_s, 1),
            "jobs_per_s": round(keys * per_key / wall_s, 1),
        }
    finally:
        sc.close()


def run(
    keys: int,
    per_key: int,
    chaos: bool,
    kill_every_s: float,
    seed: int,
    name: str | None = None,
    **env: str,
) -> dict[str, object]:
    sc = Scenario(name or ("sequence-chaos" if chaos else "sequence-calm"))
    try:
        for _ in range(2):
            sc.instance("", app_spec=APP, HJ_SEQ_BASELINE="1", **env)
        lines = enqueue(sc, "ordered", keys, per_key, seed)
        started = time.monotonic()
        dead: dict[int, int] = {}
        rng = random.Random(seed)
        kills, restarted = 0, 0
        next_kill = started + kill_every_s
        while sc.live() != 0:  # -1: Postgres did not answer this time, not "none left"
            if chaos and time.monotonic() >= next_kill:
                kills += kill_a_pool(sc, rng, dead)
                next_kill = time.monotonic() + kill_every_s
                if kills == 1 and restarted == 0:  # the rolling restart, after the first kill
                    replace(sc, 0, dead)
                    replace(sc, 1, dead)
                    restarted = 2
            time.sleep(0.05)  # the poll of a bench loop, not a synchronisation
        span = "SELECT extract(epoch FROM max(finished_at) - min(started_at)) FROM hivejobs_archive"
        wall_s = float(sql(sc.url, span)[0][0])  # first start to last finish
        report: Report = check(sc.url, sc.ledger, lines, dead)
        gaps = [float(r[0]) for r in sql(sc.url, GAPS) if r[0] is not None]
        gaps.sort()
        rescued = sql(sc.url, "SELECT count(*) FROM hivejobs_archive WHERE attempt > 1")[0][0]
        return {
            "scenario": sc.name,
            "keys": keys,
            "jobs": report.jobs,
            "lost": len(report.lost),
            "order_pg": len(report.pg_order),
            "overlap_pg": len(report.pg_overlap),
            "order_ledger": len(report.ledger_order),
            "overlap_ledger": len(report.ledger_overlap),
            "runs": report.runs,
            "rerun_jobs": rescued,
            "kills": kills,
            "rolling_restarts": restarted,
            "wall_s": round(wall_s, 1),
            "jobs_per_s": round(report.jobs / wall_s, 1),
            "gap_ms_p50": round(statistics.median(gaps), 1),
            "gap_ms_p99": round(gaps[int(len(gaps) * 0.99)], 1),
            # Hand-overs that waited for a repair (the reconciler's or the sequencer's pass)
            # rather than a push: over a second.
            "gaps_over_1s": sum(1 for g in gaps if g > 1000.0),
            "result": "pass" if report.ok else f"FAIL: {report}",
        }
    finally:
        sc.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=20)
    parser.add_argument("--per-key", type=int, default=500)
    parser.add_argument("--kill-every", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=34)
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--handover",
        choices=("listen", "no-listen"),
        help="only the calm sequenced run, with the coordinator's LISTEN session or as behind"
        " a transaction-mode pooler without a listen URL (HIVEJOBS_PGBOUNCER=1: no NOTIFY"
        " reaches it); one JSON line",
    )
    parser.add_argument(
        "--src",
        type=Path,
        default=ROOT / "src",
        help="the hivejobs tree the instances run (another checkout's src: A/B runs)",
    )
    args = parser.parse_args()
    if args.handover is not None:
        env = {"PYTHONPATH": f"{args.src}:{ROOT}"}
        if args.handover == "no-listen":
            env["HIVEJOBS_PGBOUNCER"] = "1"
        row = run(
            args.keys, args.per_key, False, 0.0, args.seed, f"handover-{args.handover}", **env
        )
        print(json.dumps({"src": str(args.src), **row}))
        return
    rows = [baseline(args.keys, args.per_key, args.seed)]
    rows += [
        run(args.keys, args.per_key, chaos, args.kill_every, args.seed) for chaos in (False, True)
    ]
    lines = [" ".join(f"{k}={v}" for k, v in row.items()) for row in rows]
    print("\n".join(lines))
    if args.out is not None:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
