"""Bench scenarios. Each returns a flat dict of figures; the caller repeats and takes medians.

Ceilings are measured in the same run on the same services, so every hivejobs figure can be
stated as a fraction of what this machine allows.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import psutil
import psycopg
import redis

from hivejobs.bench.environment import BenchEnvironment
from hivejobs.bench.options import HandlerKind, WorkKind
from hivejobs.bench.percentiles import percentiles
from hivejobs.store import connect

Figures = dict[str, float]
Progress = Callable[[str, int, int, float], None]
JOB = "bench_noop"
COMPACTED_SLACK_BYTES = 1024 * 1024  # "back to empty": within 1 MiB of the empty table
# The raw one-INSERT commit every single-enqueue figure is compared with: a logged table like
# the jobs table (a temporary one would skip the WAL flush), one row per autocommit.
RAW_TABLE = "CREATE TABLE ceiling (id text PRIMARY KEY, state text, body bytea)"


def _raw_commit(conn: psycopg.Connection[Any]) -> None:
    conn.execute("INSERT INTO ceiling VALUES (%s, 'queued', %s)", (uuid.uuid4().hex, b"{}"))


def payload(size: int) -> dict[str, Any]:
    return {"pad": "x" * max(0, size - 12)} if size > 12 else {}


def ceilings(env: BenchEnvironment, seconds: float = 1.0) -> Figures:
    """Raw Redis round trips, raw single-row commits, and the batched job life cycle."""
    client = redis.Redis.from_url(env.redis_url)
    n, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        client.ping()
        n += 1
    redis_rtt = n / seconds
    client.close()
    with connect(env.database_url) as conn:
        conn.execute(RAW_TABLE)
        n, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            _raw_commit(conn)
            n += 1
        commits = n / (time.perf_counter() - start)
        conn.execute("CREATE TABLE ceiling_done (LIKE ceiling)")
        jobs, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            ids = [uuid.uuid4().hex for _ in range(100)]
            conn.execute(
                "INSERT INTO ceiling SELECT unnest(%s::text[]), 'queued', '\\x7b7d'", (ids,)
            )
            conn.execute("UPDATE ceiling SET state = 'running' WHERE id = ANY(%s)", (ids,))
            conn.execute(
                "WITH d AS (DELETE FROM ceiling WHERE id = ANY(%s) RETURNING *) "
                "INSERT INTO ceiling_done SELECT * FROM d",
                (ids,),
            )
            jobs += 100
        lifecycle = jobs / (time.perf_counter() - start)
        conn.execute("DROP TABLE ceiling, ceiling_done")
    return {
        "redis_round_trips_per_s": redis_rtt,
        "pg_commits_per_s": commits,
        "pg_batched_lifecycle_jobs_per_s": lifecycle,
    }


def enqueue(env: BenchEnvironment, jobs: int, payload_bytes: int) -> Figures:
    """Single enqueue calls from one thread (sync, then awaited one after another on one
    event loop), then enqueue_many in batches of 10,000.

    Single enqueues alternate with slices of raw one-INSERT commits on a plain connection,
    so that their ratios compare the same minutes of this noisy machine.
    """
    assert env.app is not None
    app, body = env.app, payload(payload_bytes)
    single, rounds = min(jobs, 2000), 5
    per_round = max(1, single // rounds)
    spent = {"raw": 0.0, "sync": 0.0, "async": 0.0}
    vs_raw, async_vs_sync = [], []

    async def async_slice() -> None:
        for _ in range(per_round):
            await app.aenqueue(JOB, body)

    loop = asyncio.new_event_loop()
    loop.run_until_complete(app.aenqueue(JOB, body))  # open the async pool outside the timing
    with connect(env.database_url) as conn:
        conn.execute(RAW_TABLE)
        for _ in range(rounds):
            raw = _timed(lambda: _raw_commit(conn), per_round)
            sync = _timed(lambda: app.enqueue(JOB, body), per_round)
            aio = _timed(lambda: loop.run_until_complete(async_slice()), 1)
            vs_raw.append(raw / sync)
            async_vs_sync.append(sync / aio)
            for key, took in (("raw", raw), ("sync", sync), ("async", aio)):
                spent[key] += took
        conn.execute("DROP TABLE ceiling")
    loop.run_until_complete(app.aclose())
    loop.close()
    bulk = max(jobs, 10_000)
    start = time.perf_counter()
    for offset in range(0, bulk, 10_000):
        app.enqueue_many(JOB, [body] * min(10_000, bulk - offset))
    bulk_rate = bulk / (time.perf_counter() - start)
    env.reset_jobs()
    env.clear_redis(keep_boot_marker=True)
    return {
        "enqueue_single_per_s": per_round * rounds / spent["sync"],
        "enqueue_async_single_per_s": per_round * rounds / spent["async"],
        "raw_commits_alongside_per_s": per_round * rounds / spent["raw"],
        "enqueue_single_vs_raw": statistics.median(vs_raw),
        "enqueue_async_vs_sync": statistics.median(async_vs_sync),
        "enqueue_bulk_per_s": bulk_rate,
    }


def _timed(fn: Callable[[], object], times: int) -> float:
    start = time.perf_counter()
    for _ in range(times):
        fn()
    return time.perf_counter() - start


def throughput(
    env: BenchEnvironment,
    jobs: int,
    processes: int,
    concurrency: int,
    work_ms: float,
    payload_bytes: int,
    progress: Progress,
    work: WorkKind = "sleep",
    handler: HandlerKind = "sync",
) -> Figures:
    """A backlog drained by a real `hivejobs run`: steady rate from first to last finish,
    and what the drain cost Postgres per job (bench.cost)."""
    from hivejobs.bench.cost import DrainCost

    assert env.app is not None
    body = payload(payload_bytes)
    for offset in range(0, jobs, 10_000):
        env.app.enqueue_many(JOB, [body] * min(10_000, jobs - offset))
    cost = DrainCost(env)
    started = time.perf_counter()
    env.start_worker(processes, concurrency, work_ms, work, handler=handler)
    _wait_done(env, jobs, started, "throughput", progress)
    wall = time.perf_counter() - started
    cost.drained()
    first, last = env.sql(
        "SELECT extract(epoch FROM min(finished_at)), "
        "extract(epoch FROM max(finished_at)) FROM hivejobs_archive"
    )[0]
    env.stop_worker()
    steady = (jobs - 1) / max(float(last) - float(first), 1e-6)
    figures = {"throughput_jobs_per_s": steady, "drain_wall_s": wall, **cost.figures(jobs)}
    env.reset_jobs()
    return figures


def latency(
    env: BenchEnvironment,
    rate: float,
    duration: float,
    processes: int,
    concurrency: int,
    progress: Progress,
    handler: HandlerKind = "sync",
) -> Figures:
    """Steady enqueue rate against idle workers: enqueue call to handler start, and enqueue
    to succeeded.

    Several paced client threads, as several web processes would: one thread cannot issue
    more single enqueues per second than Postgres does synchronous commits on one connection.
    """
    app = env.app
    assert app is not None
    env.start_worker(processes, concurrency, 0.0, handler=handler)
    total = int(rate * duration)
    clients = max(1, min(8, int(rate // 250)))
    begin = time.perf_counter()

    def client(k: int) -> None:
        for i in range(k, total, clients):
            pause = begin + i / rate - time.perf_counter()
            if pause > 0:
                time.sleep(pause)  # pacing the load generator, not synchronisation
            app.enqueue(JOB, {"t": time.time()})

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    achieved = total / (time.perf_counter() - begin)
    _wait_done(env, total, begin, "latency", progress)
    env.stop_worker()
    values = sorted(env.latencies_us())
    # Enqueue to succeeded on the database's clock: the enqueue's transaction to the one that
    # wrote the completion (both `now()`, their transactions' start).
    done = sorted(
        float(ms)
        for (ms,) in env.sql(
            "SELECT extract(epoch FROM finished_at - created_at) * 1000 FROM hivejobs_archive"
            " WHERE state = 'succeeded'"
        )
    )
    env.reset_jobs()
    if not values:
        return {}
    env.latencies_ms = [v / 1000 for v in values]
    p50, p95, p99 = percentiles(values, 50, 95, 99)
    figures = {
        "pickup_p50_ms": p50 / 1000,
        "pickup_p95_ms": p95 / 1000,
        "pickup_p99_ms": p99 / 1000,
        "pickup_max_ms": values[-1] / 1000,
        "achieved_rate_per_s": achieved,
    }
    if done:
        s50, s99 = percentiles(done, 50, 99)
        figures.update(succeeded_p50_ms=s50, succeeded_p99_ms=s99)
    return figures


def backlog(
    env: BenchEnvironment, jobs: int, processes: int, concurrency: int, progress: Progress
) -> Figures:
    """A large backlog drained: throughput at start vs end, RSS, and the hot table's size
    empty, full, and once the coordinator has compacted it after the drain."""
    assert env.app is not None
    size_empty = _hot_table_bytes(env)
    for offset in range(0, jobs, 10_000):
        env.app.enqueue_many(JOB, [{}] * min(10_000, jobs - offset))
        progress("backlog enqueue", offset, jobs, 0.0)
    size_full = _hot_table_bytes(env)
    begin = time.perf_counter()
    env.start_worker(processes, concurrency, 0.0)
    rss_spawned = _rss_kib(env.pool_pids())
    rss_start = 0.0  # after the first window: warm caches and prepared statements are not growth
    window = max(jobs // 20, 1000)
    rates: list[float] = []
    done, mark, mark_t = 0, 0, time.perf_counter()
    curve = env.drain_curves["backlog"] = []
    while done < jobs:
        time.sleep(0.5)  # sampling interval of a long drain
        done = env.archived()
        curve.append((time.perf_counter() - begin, done))
        if done - mark >= window:
            rates.append((done - mark) / (time.perf_counter() - mark_t))
            mark, mark_t = done, time.perf_counter()
            rss_start = rss_start or _rss_kib(env.pool_pids())
        progress("backlog", done, jobs, time.perf_counter() - begin)
    drained = time.perf_counter()
    rss_end = _rss_kib(env.pool_pids())
    # The running coordinator gives the space back (Compactor); wait for it, within reason.
    size_end = _hot_table_bytes(env)
    while size_end > size_empty + COMPACTED_SLACK_BYTES and time.perf_counter() - drained < 120:
        time.sleep(1.0)  # polling the table size, not synchronisation
        size_end = _hot_table_bytes(env)
    compacted_after = time.perf_counter() - drained
    env.stop_worker()
    return {
        "backlog_rate_start_per_s": statistics.median(rates[:3]) if rates else 0.0,
        "backlog_rate_end_per_s": statistics.median(rates[-3:]) if rates else 0.0,
        "backlog_pool_rss_spawned_kib": rss_spawned,
        "backlog_pool_rss_start_kib": rss_start or rss_spawned,
        "backlog_pool_rss_end_kib": rss_end,
        "backlog_hot_table_bytes_empty": size_empty,
        "backlog_hot_table_bytes_full": size_full,
        "backlog_hot_table_bytes_end": size_end,
        "backlog_compacted_after_s": compacted_after,
        "backlog_wall_s": drained - begin,
    }


def _wait_done(
    env: BenchEnvironment, total: int, began: float, label: str, progress: Progress
) -> None:
    deadline = time.perf_counter() + 600
    curve = env.drain_curves[label] = []
    while True:
        done = env.archived()
        curve.append((time.perf_counter() - began, done))
        progress(label, done, total, time.perf_counter() - began)
        if done >= total:
            return
        if time.perf_counter() > deadline or (env.worker and env.worker.poll() is not None):
            raise RuntimeError(f"{label}: {done}/{total} done; see {env.workdir}/worker.log")
        time.sleep(0.1)  # progress polling interval


def _hot_table_bytes(env: BenchEnvironment) -> float:
    return float(env.sql("SELECT pg_total_relation_size('hivejobs_job')")[0][0])


def _rss_kib(pids: list[int]) -> float:
    """The pools' resident sets summed (a pool that exited meanwhile counts nothing)."""
    total = 0
    for pid in pids:
        try:
            total += psutil.Process(pid).memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return total / 1024


def stderr_progress(label: str, done: int, total: int, elapsed: float) -> None:
    """Live progress: jobs done, rate, ETA, on one rewritten line."""
    if not sys.stderr.isatty() and done < total:
        return
    rate = done / elapsed if elapsed > 0 else 0.0
    eta = (total - done) / rate if rate > 0 else float("inf")
    end = "\n" if done >= total else "\r"
    sys.stderr.write(
        f"  {label}: {done}/{total} jobs, average {rate:,.0f} jobs/s since the first,"
        f" ETA {eta:.0f} s   {end}"
    )
    sys.stderr.flush()
