"""Chain speed: hop latency (a job's end to its successor's start) and a 1,000-job chain.

    python bench/chains.py [--hops 200] [--width 50] [--layers 20] [--job-ms 10]

Creates a throwaway database and Redis prefix, runs `hivejobs run tests.apps.chainapp:app`,
and reads the handlers' ledger (monotonic clock, shared by every process on this machine).
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
from hivejobs.bench.percentiles import percentiles  # noqa: E402


def wait_done(app: App, request_id: str, timeout: float = 600.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = app.chain_status(request_id).state
        if state in ("succeeded", "failed", "stopped"):
            return state
        time.sleep(0.02)
    raise TimeoutError(request_id)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hops", type=int, default=200)
    parser.add_argument("--width", type=int, default=50)
    parser.add_argument("--layers", type=int, default=20)
    parser.add_argument("--job-ms", type=float, default=10.0)
    args = parser.parse_args()
    admin = pg_admin_url()
    name = f"hjbench_chain_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = db_url(admin, name)
    prefix = f"hjbench:{uuid.uuid4().hex[:8]}:"
    ledger = Path(tempfile.mkdtemp(prefix="hjchain"))
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
        "HJ_CHAIN_CONCURRENCY": str(args.width),
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
        line = Chain("hops")
        prev = None
        for i in range(args.hops):
            prev = line.job("step", {}, key=f"h{i:04d}", after=[prev] if prev else [])
        rid = app.run_chain(line)
        assert wait_done(app, rid) == "succeeded"
        rows = read_ledger(ledger)
        starts = {p[1].split(":")[1]: int(p[4]) for p in rows if p[0] == "start"}
        ends = {p[1].split(":")[1]: int(p[5]) for p in rows if p[0] == "end"}
        hops = sorted(
            (starts[f"h{i + 1:04d}"] - ends[f"h{i:04d}"]) / 1e6 for i in range(args.hops - 1)
        )
        p50, p99 = percentiles(hops, 50, 99)
        print(
            f"hop latency over {len(hops)} hops: p50 {p50:.1f} ms, "
            f"p99 {p99:.1f} ms, max {hops[-1]:.1f} ms"
        )

        mesh = Chain("mesh")
        layer: list = []
        for n in range(args.layers):
            layer = [
                mesh.job(
                    "step",
                    {"ms": args.job_ms},
                    key=f"l{n:02d}j{i:02d}",
                    after=[layer[i], layer[(i + 1) % args.width]] if layer else [],
                )
                for i in range(args.width)
            ]
        began = time.monotonic()
        rid = app.run_chain(mesh)
        assert wait_done(app, rid) == "succeeded"
        took = time.monotonic() - began
        total = args.width * args.layers
        floor = args.layers * args.job_ms / 1000
        print(
            f"{total}-job chain, width {args.width}, {args.layers} layers of {args.job_ms:g} "
            f"ms jobs: {took:.2f} s (job time on the critical path {floor:.2f} s; "
            f"{(took - floor) / args.layers * 1000:.0f} ms per layer overhead)"
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
