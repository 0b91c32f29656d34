"""`hivejobs bench --scenarios fairness`: does a small key get through a big backlog, and what
does fair dispatch (`fair_by`, broker/fair.py) cost in drain rate, at 1 to 10,000 keys?

One worker runs the no-op job under two types: `bench_fair` (fair_by="customer") and
`bench_noop` (plain FIFO, the control). Each round enqueues a backlog of `jobs` jobs spread
over K keys (k0..k{K-1}, in turn), then 50 jobs of one more key, "B"; the type is paused
while they go in (a worker draining as fast as they are stored would leave no backlog), then
resumed. It measures B's last finish after the first start of the round (the resume;
database clock), and the round's drain rate from first to last finish. Each K in KEYS runs
a FIFO round (its order ignores the key) and then a fair one. With K keys, round-robin
gives B one turn in K + 1: at K = 1 B finishes at once, at K = 10,000 B is one key among
10,001 and waits its turns like the others.
"""

from __future__ import annotations

import time

import psutil

from hivejobs.bench.cost import backend_cpu_s
from hivejobs.bench.environment import BenchEnvironment
from hivejobs.bench.scenarios import Figures, Progress, _wait_done

KEYS = (1, 10, 1_000, 10_000)
SMALL = 50  # B's jobs


def fairness_scenario(
    env: BenchEnvironment,
    jobs: int,
    processes: int,
    concurrency: int,
    work_ms: float,
    progress: Progress,
) -> Figures:
    assert env.app is not None
    env.start_worker(processes, concurrency, work_ms, extra_env={"HIVEJOBS_BENCH_FAIR": "1"})
    fleet = env.app
    fleet.types.clear()  # enqueue through the types the worker declared
    figures: Figures = {}
    # A FIFO round beside each fair one: on a shared machine the two of a ratio then fall in
    # the same minutes.
    for k in KEYS:
        for label, name in ((f"fifo_{k}_keys", "bench_noop"), (f"fair_{k}_keys", "bench_fair")):
            b_wait, rate, cpu = _round(env, name, jobs, k, label, progress)
            figures[f"{label}_b_last_after_s"] = b_wait
            figures[f"{label}_jobs_per_s"] = rate
            for part, seconds in cpu.items():
                figures[f"{label}_{part}_cpu_us_per_job"] = seconds * 1e6 / (jobs + SMALL)
            env.reset_jobs()
            env.clear_redis(keep_boot_marker=True)
        figures[f"fair_{k}_keys_vs_fifo_rate"] = (
            figures[f"fair_{k}_keys_jobs_per_s"] / figures[f"fifo_{k}_keys_jobs_per_s"]
        )
        if f"fifo_{k}_keys_all_cpu_us_per_job" in figures:
            figures[f"fair_{k}_keys_vs_fifo_cpu"] = (
                figures[f"fair_{k}_keys_all_cpu_us_per_job"]
                / figures[f"fifo_{k}_keys_all_cpu_us_per_job"]
            )
    env.stop_worker()
    return figures


def _round(
    env: BenchEnvironment, name: str, jobs: int, keys: int, label: str, progress: Progress
) -> tuple[float, float, dict[str, float]]:
    """(B's last job's finish after B's enqueue, s; the round's drain rate, jobs/s; the CPU
    seconds of the drain, by part: see _cpu_s)."""
    assert env.app is not None
    # Paused while the backlog goes in: a worker draining faster than enqueue_many stores
    # would leave no backlog for B to wait behind.
    env.app.pause(name)
    for offset in range(0, jobs, 10_000):
        size = min(10_000, jobs - offset)
        env.app.enqueue_many(name, [{"customer": f"k{(offset + i) % keys}"} for i in range(size)])
    small = env.app.enqueue_many(name, [{"customer": "B"}] * SMALL)
    began = time.perf_counter()
    cpu_before = _cpu_s(env)
    env.app.resume(name)
    _wait_done(env, jobs + SMALL, began, f"fairness {label}", progress)
    cpu = {part: spent - cpu_before.get(part, 0.0) for part, spent in _cpu_s(env).items()}
    # From the resume (B's first started job at the earliest) to B's last finish: on the
    # database clock, as both ends are its timestamps.
    b_wait = env.sql(
        "SELECT extract(epoch FROM max(a.finished_at) - (SELECT min(started_at)"
        " FROM hivejobs_archive)) FROM hivejobs_archive a WHERE a.id = ANY(%s)",
        (small,),
    )[0][0]
    first, last = env.sql(
        "SELECT extract(epoch FROM min(finished_at)), extract(epoch FROM max(finished_at))"
        " FROM hivejobs_archive"
    )[0]
    return float(b_wait), (jobs + SMALL - 1) / max(float(last) - float(first), 1e-6), cpu


def _cpu_s(env: BenchEnvironment) -> dict[str, float]:
    """User + system CPU seconds so far of the worker's processes (supervisor, pools,
    coordinator), of the bench database's Postgres backends and of the Redis server, and
    their sum ("all"). A drain's rate on a shared machine follows the load of the minute;
    what it costs does not. The Redis server's figure counts every client of that server
    (it may serve others), so it is an upper bound; the others are this bench's alone.
    Parts this machine cannot see (a remote server) are left out."""
    assert env.app is not None and env.worker is not None
    parts: dict[str, float] = {}
    try:
        root = psutil.Process(env.worker.pid)
        procs = [root, *root.children(recursive=True)]
        parts["worker"] = sum(sum(p.cpu_times()[:2]) for p in procs)
    except psutil.Error:
        pass
    parts["postgres"] = sum(backend_cpu_s(env).values())
    info = env.app.connections.broker.redis.info("cpu")
    redis_pid = env.app.connections.broker.redis.info("server").get("process_id")
    if redis_pid and psutil.pid_exists(int(redis_pid)):
        parts["redis"] = float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
    parts["all"] = sum(parts.values())
    return parts
