"""Fan-out from a running chain job: one job adds N jobs and a join after them (ctx.chain.add).

    python bench/fanout.py [--n 10000] [--concurrency 50] [--declared]

Creates a throwaway database and Redis prefix, runs `hivejobs run tests.apps.chainapp:app`,
and reads the handlers' ledger (monotonic clock, shared by every process on this machine).
Job bodies: `fanout` (builds the N jobs and calls ctx.chain.add once), `fanleaf` (returns its
key, nothing else), `merge` (reads the N results through ctx.upstream and adds them up).
Reports the add (checks and the one transaction, timed inside the handler), the drain (the
adding job's end to the join's end) and the whole chain as the client sees it. With
`--declared`, the same jobs are declared at run_chain instead (the adding job adds nothing):
the drain of the same DAG without fan-out, for comparison.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.chains import wait_done  # noqa: E402
from bench.harness import (  # noqa: E402
    FAST_SETTINGS,
    REDIS_URL,
    db_url,
    pg_admin_url,
    read_ledger,
    sql,
    wait_until,
)

from hivejobs import App, Chain  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--declared", action="store_true")
    args = parser.parse_args()
    admin = pg_admin_url()
    name = f"hjbench_fanout_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = db_url(admin, name)
    prefix = f"hjbench:{uuid.uuid4().hex[:8]}:"
    ledger = Path(tempfile.mkdtemp(prefix="hjfanout"))
    from tests.apps.chainapp import app as declared

    app = App(database_url=url, redis_url=REDIS_URL, prefix=prefix)
    app.types.update(declared.types)
    app.migrate()
    env = {
        **os.environ,
        "HIVEJOBS_DATABASE_URL": url,
        "HIVEJOBS_REDIS_URL": REDIS_URL,
        "HIVEJOBS_PREFIX": prefix,
        "HJ_LEDGER": str(ledger),
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
        "HJ_CHAIN_CONCURRENCY": str(args.concurrency),
        "HIVEJOBS_LOG_LEVEL": "WARNING",
    }
    env.update({"HIVEJOBS_" + k.upper(): str(v) for k, v in FAST_SETTINGS.items()})
    proc = subprocess.Popen(
        [sys.executable, "-m", "hivejobs", "run", "tests.apps.chainapp:app"],
        cwd=ROOT,
        env=env,
        start_new_session=True,
    )
    try:
        pools = "SELECT count(*) FROM hivejobs_worker WHERE role = 'pool'"
        wait_until(lambda: sql(url, pools)[0][0] >= len(declared.types), what="chain pools")
        chain = Chain("fan-out")
        scan = chain.job("fanout", {"n": 0 if args.declared else args.n}, key="scan")
        if args.declared:
            leaves = [
                chain.job("fanleaf", {"n": i}, key=f"scan.{i + 1}", after=[scan])
                for i in range(args.n)
            ]
            chain.job("merge", {"expect": args.n}, key="scan.join", after=leaves)
        began = time.monotonic()
        request_id = app.run_chain(chain)
        state = wait_done(app, request_id, timeout=1800)
        took = time.monotonic() - began
        assert state == "succeeded", state
        status = app.chain_status(request_id)
        join = next(j for j in status.jobs if j.key == "scan.join")
        assert join.result == {"count": args.n, "sum": sum(range(args.n))}, join.result
        assert len(status.jobs) == args.n + 2
        rows = read_ledger(ledger)
        ends = {p[1].split(":")[1]: int(p[5]) for p in rows if p[0] == "end"}
        add_s = 0.0 if args.declared else next(int(p[5]) for p in rows if p[0] == "added") / 1e9
        drain_s = (ends["scan.join"] - ends["scan"]) / 1e9
        how = "declared at run_chain" if args.declared else "added by one job"
        print(
            f"{args.n} jobs (+1 join) {how}, {args.concurrency} threads: "
            f"add {add_s:.2f} s (one ctx.chain.add: checks + one transaction), drain "
            f"{drain_s:.2f} s (adding job's end to the join's end, {args.n / drain_s:.0f} "
            f"jobs/s), whole chain {took:.2f} s as the client saw it"
        )
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
        keys = list(app.connections.broker.redis.scan_iter(match=prefix + "*"))
        if keys:
            app.connections.broker.redis.delete(*keys)
        app.close()
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
