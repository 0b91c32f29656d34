"""`hivejobs bench --scenarios stale-stats`: one backlog drained under four planner states.

Postgres plans each statement from the statistics of the last ANALYZE, which rarely describe
the queue being drained: none (a new table; autovacuum off, as on our development and CI
machines), an empty table (a fresh deploy, or a quiet spell before a burst), or a full queue
(an ANALYZE during a bulk enqueue, nothing running). And a session keeps the plans of the
statements it prepared: `quiet` starts the worker on an empty queue, runs QUIET_JOBS one at a
time (its sessions prepare their statements on a table of a job or two), pauses the type
while the backlog is enqueued and drains it with those plans. Each state gets a database of
its own, so no drain inherits another's dead rows; the rates should agree within 10 %. Wall-clock
rates on a shared machine move with its load, so two figures that do not are reported beside
them: buffers touched per job (this database's, all statements) and the CPU time its
Postgres backends used per job (psutil: only when Postgres runs on this machine).
"""

from __future__ import annotations

import time

from hivejobs.bench.cost import backend_cpu_s, quiesce
from hivejobs.bench.environment import BenchEnvironment
from hivejobs.bench.scenarios import JOB, Figures, Progress
from hivejobs.store import connect

# name in the figures -> when ANALYZE runs (never, on the empty table, on the full queue), or
# the worker starts before the backlog
STATES = {
    "none": None,
    "empty": "before enqueue",
    "full": "after enqueue",
    "quiet": "worker first",
}
QUIET_JOBS = 100  # enough for every session of the pools to run each statement five times
ENQUEUE_SLICE = 10_000
SAMPLE_S = 0.5  # running rows are sampled this often while draining
# The running index's own predicate, so that sampling reads the running rows only.
RUNNING = "SELECT count(*) FROM hivejobs_job WHERE state = 'running' AND worker_id IS NOT NULL"


def stale_stats(
    env: BenchEnvironment, jobs: int, processes: int, concurrency: int, progress: Progress
) -> Figures:
    figures: Figures = {
        "stale_stats_autovacuum_on": 1.0 if _autovacuum_on(env) else 0.0,
    }
    for name, analyze in STATES.items():
        with BenchEnvironment(env.server_url, env.redis_url) as own:
            figures.update(_drain(own, name, analyze, jobs, processes, concurrency, progress))
    rates = [figures[f"stale_stats_{name}_per_s"] for name in STATES]
    figures["stale_stats_slowest_vs_fastest"] = min(rates) / max(rates)
    return figures


def _drain(
    env: BenchEnvironment,
    name: str,
    analyze: str | None,
    jobs: int,
    processes: int,
    concurrency: int,
    progress: Progress,
) -> Figures:
    assert env.app is not None
    if analyze == "before enqueue":
        env.sql("ANALYZE hivejobs_job")
    if analyze == "worker first":
        _quiet_start(env, processes, concurrency)
    for offset in range(0, jobs, ENQUEUE_SLICE):
        env.app.enqueue_many(JOB, [{}] * min(ENQUEUE_SLICE, jobs - offset))
        progress(f"stale-stats {name}: enqueue", offset, jobs, 0.0)
    if analyze == "after enqueue":
        env.sql("ANALYZE hivejobs_job")
    if analyze != "worker first":
        quiesce(env)  # the enqueue's sessions' counts land before the drain's start
    blocks_before = _blocks(env)
    # The worker's backends' CPU so far (quiet: the quiet jobs, the pause, the enqueue).
    cpu_before = backend_cpu_s(env)
    began = time.perf_counter()
    # The rate is the backlog's from here: a paused pool may still finish a job it held.
    drain_from = float(env.sql("SELECT extract(epoch FROM now())")[0][0])
    if analyze == "worker first":
        env.app.resume(JOB)
        env.app.close()
    else:
        env.start_worker(processes, concurrency, 0.0)
    done, most_running, deadline = 0, 0, began + 3600
    with Sampler(env) as sampler:
        while done < jobs:
            time.sleep(SAMPLE_S)  # sampling interval of a long drain, not synchronisation
            done = sampler.count("SELECT count(*) FROM hivejobs_archive")
            most_running = max(most_running, sampler.count(RUNNING))
            progress(f"stale-stats {name}", done, jobs, time.perf_counter() - began)
            if time.perf_counter() > deadline or (env.worker and env.worker.poll() is not None):
                raise RuntimeError(f"stale-stats {name}: {done}/{jobs} done; see {env.workdir}")
    cpu_s = sum(cpu - cpu_before.get(pid, 0.0) for pid, cpu in backend_cpu_s(env).items())
    env.stop_worker()
    quiesce(env)
    blocks = _blocks(env) - blocks_before - sampler.buffers
    first, last, drained = env.sql(
        "SELECT extract(epoch FROM min(finished_at)), extract(epoch FROM max(finished_at)), "
        "count(*) FROM hivejobs_archive WHERE finished_at >= to_timestamp(%s)",
        (drain_from,),
    )[0]
    figures = {
        f"stale_stats_{name}_per_s": (drained - 1) / max(float(last) - float(first), 1e-6),
        f"stale_stats_{name}_buffers_per_job": blocks / jobs,
        f"stale_stats_{name}_most_running": float(most_running),
    }
    if cpu_s > 0:
        figures[f"stale_stats_{name}_pg_cpu_ms_per_job"] = cpu_s * 1000 / jobs
    return figures


def _quiet_start(env: BenchEnvironment, processes: int, concurrency: int) -> None:
    """The worker on an empty queue, QUIET_JOBS run one at a time, then the type paused for
    the backlog's enqueue; the quiet jobs' archive rows go, so that the drain's figures are
    the backlog's alone."""
    assert env.app is not None
    env.start_worker(processes, concurrency, 0.0)
    for n in range(1, QUIET_JOBS + 1):
        env.app.enqueue(JOB, {})
        deadline = time.perf_counter() + 60
        while env.archived() < n:
            if time.perf_counter() > deadline:
                raise RuntimeError(f"stale-stats quiet: job {n} not done; see {env.workdir}")
            time.sleep(0.005)  # polling a count in another process
    env.app.pause(JOB)
    env.sql("DELETE FROM hivejobs_archive")


class Sampler:
    """Counts read while a drain runs, on one connection of its own, with the buffers they
    touch added up so that the drain's buffers per job leave them out: a count of the
    archive twice a second reads more than the drain's own statements do per job."""

    def __init__(self, env: BenchEnvironment) -> None:
        self.conn = connect(env.database_url)
        # One plan whose scan row count is the count (no parallel partial counts).
        self.conn.execute("SET max_parallel_workers_per_gather = 0")
        self.buffers = 0

    def __enter__(self) -> Sampler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.conn.close()

    def count(self, query: str) -> int:
        """`query` is a `SELECT count(*) FROM ...`: run under EXPLAIN ANALYZE to count its
        buffers; the count is the rows its scan produced."""
        row = self.conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + query).fetchone()
        assert row is not None
        explained = row[0][0]
        top, planning = explained["Plan"], explained.get("Planning", {})
        for node in (top, planning):
            self.buffers += node.get("Shared Hit Blocks", 0) + node.get("Shared Read Blocks", 0)
        scan = top["Plans"][0]
        return int(scan["Actual Rows"]) * int(scan["Actual Loops"])


def _autovacuum_on(env: BenchEnvironment) -> bool:
    return str(env.sql("SHOW autovacuum")[0][0]) == "on"


def _blocks(env: BenchEnvironment) -> int:
    """Buffers this database's sessions touched so far (hits and reads), all statements."""
    rows = env.sql(
        "SELECT blks_hit + blks_read FROM pg_stat_database WHERE datname = current_database()"
    )
    return int(rows[0][0])
