"""Dashboard and API page times over a big archive: `python -m hivejobs.bench.dashboard`.

Fills a sandbox database (bench/environment.py) with `--rows` archived jobs in one INSERT ...
SELECT generate_series (2 % failed, finished over the last day) and 10,000 chains, starts a
real `hivejobs serve` (uvicorn) on it, and times each page over HTTP: the first page and a deep
one (reached by following `next` cursors), median and p95 of `--repeats` requests. Keyset
pages cost the same at any depth and archive size; no page counts the archive.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from typing import Any

import httpx
import msgspec

from hivejobs.bench.environment import BenchEnvironment
from hivejobs.bench.percentiles import percentiles
from hivejobs.config import DEFAULT_REDIS_URL

TOKEN = "bench-dashboard-token"
FILL_ARCHIVE = """
INSERT INTO hivejobs_archive (id, name, state, priority, attempt, attempts, delivery, payload,
                              created_at, run_at, started_at, finished_at, error)
SELECT 'bench-' || n, 'bench_' || (n %% 5),
       CASE WHEN n %% 50 = 0 THEN 'failed' ELSE 'succeeded' END, 0, 1, 5, 'at_least_once',
       convert_to('{"n": ' || n || '}', 'UTF8'),
       now() - n * interval '86 ms' - interval '1 s', now() - n * interval '86 ms' - interval '1 s',
       now() - n * interval '86 ms' - interval '500 ms', now() - n * interval '86 ms',
       CASE WHEN n %% 50 = 0 THEN 'Traceback (most recent call last): RuntimeError: bench' END
  FROM generate_series(1, %(rows)s) AS n
"""
FILL_CHAINS = """
INSERT INTO hivejobs_chain (id, name, args, state, jobs, created_at, finished_at)
SELECT 'chain-' || n, 'bench', convert_to('{}', 'UTF8'), 'succeeded', 3,
       now() - n * interval '1 s', now() - n * interval '1 s' + interval '200 ms'
  FROM generate_series(1, 10000) AS n
"""


class PageTime(msgspec.Struct):
    page: str
    median_ms: float
    p95_ms: float
    bytes: int


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def fill(env: BenchEnvironment, rows: int) -> float:
    began = time.monotonic()
    env.sql(FILL_ARCHIVE, {"rows": rows})
    env.sql(FILL_CHAINS)
    env.sql("ANALYZE hivejobs_archive")
    env.sql("ANALYZE hivejobs_chain")
    return time.monotonic() - began


def deep_cursor(client: httpx.Client, state: str, pages: int, **params: str) -> str | None:
    """The `after` of page `pages` + 1, by following `next` links (as a user paging would)."""
    after: str | None = None
    for _ in range(pages):
        query: dict[str, Any] = {"state": state, "limit": 50, **params}
        if after:
            query["after"] = after
        after = client.get("/v1/jobs", params=query).json()["next"]
    return after


def time_page(client: httpx.Client, name: str, url: str, repeats: int) -> PageTime:
    times, size = [], 0
    client.get(url)  # warm: plans cached, connection open
    for _ in range(repeats):
        began = time.perf_counter()
        r = client.get(url)
        times.append((time.perf_counter() - began) * 1000)
        r.raise_for_status()
        size = len(r.content)
    p50, p95 = percentiles(times, 50, 95)
    return PageTime(name, round(p50, 2), round(p95, 2), size)


def measure(env: BenchEnvironment, repeats: int) -> list[PageTime]:
    port = free_port()
    proc_env = dict(os.environ)
    proc_env.update(
        {
            "HIVEJOBS_DATABASE_URL": env.database_url,
            "HIVEJOBS_REDIS_URL": env.redis_url,
            "HIVEJOBS_PREFIX": env.prefix,
            "HIVEJOBS_ADMIN_TOKENS": TOKEN,
            "HIVEJOBS_LOG_LEVEL": "WARNING",
        }
    )
    cmd = [
        sys.executable,
        "-m",
        "hivejobs",
        "serve",
        "hivejobs.bench.benchapp:app",
        "--port",
        str(port),
    ]
    proc = subprocess.Popen(cmd, env=proc_env)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=30)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if client.get("/healthz").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("hivejobs serve did not start")
            time.sleep(0.1)
        failed_deep = deep_cursor(client, "failed", 100)
        finished_deep = deep_cursor(client, "finished", 100)
        typed_deep = deep_cursor(client, "finished", 100, type="bench_3")
        pages = [
            ("dashboard: job types", "/dashboard?fragment=1"),
            ("dashboard: failed, page 1", "/dashboard/failed?fragment=1"),
            ("dashboard: failed, page 101", f"/dashboard/failed?fragment=1&after={failed_deep}"),
            ("dashboard: type finished, page 1", "/dashboard/types/bench_3?state=finished"),
            (
                "dashboard: type finished, page 101",
                f"/dashboard/types/bench_3?state=finished&after={typed_deep}",
            ),
            ("dashboard: job", "/dashboard/jobs/bench_1/bench-12346"),
            ("dashboard: chains, page 1", "/dashboard/chains?fragment=1"),
            ("dashboard: workers", "/dashboard/workers?fragment=1"),
            ("api: finished, page 1", "/v1/jobs?state=finished&limit=50"),
            ("api: finished, page 101", f"/v1/jobs?state=finished&limit=50&after={finished_deep}"),
            ("api: job", "/v1/jobs/bench_1/bench-12346"),
            ("api: jobtypes", "/v1/jobtypes"),
            ("metrics", "/metrics"),
        ]
        return [time_page(client, name, url, repeats) for name, url in pages]
    finally:
        client.close()
        proc.terminate()
        proc.wait(10)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hivejobs.bench.dashboard", description=__doc__)
    p.add_argument("--rows", type=int, default=1_000_000, help="archived jobs to insert")
    p.add_argument("--repeats", type=int, default=30, help="requests per page")
    p.add_argument("--database-url", default=os.environ.get("HIVEJOBS_DATABASE_URL"))
    p.add_argument("--redis-url", default=os.environ.get("HIVEJOBS_REDIS_URL", DEFAULT_REDIS_URL))
    p.add_argument("--json", metavar="FILE", help="write the results as JSON")
    args = p.parse_args(argv)
    server = args.database_url or "postgresql://127.0.0.1:5432/postgres"
    with BenchEnvironment(server, args.redis_url) as env:
        fill_s = fill(env, args.rows)
        archive = env.sql("SELECT pg_size_pretty(pg_total_relation_size('hivejobs_archive'))")
        print(f"{args.rows} archived jobs inserted in {fill_s:.1f} s ({archive[0][0]})")
        results = measure(env, args.repeats)
    width = max(len(r.page) for r in results)
    print(f"{'page':<{width}}  median ms  p95 ms   bytes")
    for r in results:
        print(f"{r.page:<{width}}  {r.median_ms:9.2f}  {r.p95_ms:6.2f}  {r.bytes:6d}")
    if args.json:
        with open(args.json, "wb") as fh:
            fh.write(msgspec.json.encode({"rows": args.rows, "fill_s": fill_s, "pages": results}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
