"""`hivejobs bench --scenarios progress`: what ctx.progress and ctx.emit cost a job's
throughput, side by side with the same job body without them.

One worker runs two types with one body (benchapp.py: the job's work in 10 steps):
`bench_progress_off` does nothing more, `bench_progress_on` reports each step
(ctx.progress) and emits one partial result. Each drains the same backlog twice, in the
order off, on, on, off, so that a drift of the machine during the run weighs on both
alike; throughput is the steady rate from first to last finish, as in `throughput`. Also
counted: the progress rows left per job (one: each job's last report, stored when its
attempt ends; the rows are upserted, so this does not count the writes).
"""

from __future__ import annotations

import time

from hivejobs.bench.environment import BenchEnvironment
from hivejobs.bench.scenarios import Figures, Progress, _wait_done

ORDER = ("off", "on", "on", "off")


def progress_scenario(
    env: BenchEnvironment,
    jobs: int,
    processes: int,
    concurrency: int,
    sweep: list[float],
    progress: Progress,
) -> Figures:
    """Each job duration of `sweep` (ms) in turn; its figures prefixed with it ("10ms_")
    when there are several."""
    figures: Figures = {}
    for work_ms in sweep:
        prefix = f"{work_ms:g}ms_" if len(sweep) > 1 else ""
        one = _drains(env, jobs, processes, concurrency, work_ms, progress)
        figures |= {prefix + key: value for key, value in one.items()}
    return figures


def _drains(
    env: BenchEnvironment,
    jobs: int,
    processes: int,
    concurrency: int,
    work_ms: float,
    progress: Progress,
) -> Figures:
    assert env.app is not None
    env.start_worker(processes, concurrency, work_ms, extra_env={"HIVEJOBS_BENCH_PROGRESS": "1"})
    fleet = env.app
    fleet.types.clear()  # enqueue through the types the worker declared
    rates: dict[str, list[float]] = {"off": [], "on": []}
    rows = 0
    for label in ORDER:
        name = f"bench_progress_{label}"
        # This type's previous drain out of the way: first and last finish are this one's.
        env.sql("DELETE FROM hivejobs_archive WHERE name = %s", (name,))
        done = env.archived() + jobs
        fleet.enqueue_many(name, [{}] * jobs)
        _wait_done(env, done, time.perf_counter(), f"progress {label}", progress)
        first, last = env.sql(
            "SELECT extract(epoch FROM min(finished_at)), extract(epoch FROM max(finished_at))"
            " FROM hivejobs_archive WHERE name = %s",
            (name,),
        )[0]
        rates[label].append((jobs - 1) / max(float(last) - float(first), 1e-6))
        if label == "on":
            rows += int(env.sql("SELECT count(*) FROM hivejobs_progress")[0][0])
            env.sql("DELETE FROM hivejobs_progress")
    env.stop_worker()
    env.reset_jobs()
    off, on = (sum(rates[k]) / len(rates[k]) for k in ("off", "on"))
    return {
        "without_progress_jobs_per_s": off,
        "with_progress_jobs_per_s": on,
        "with_vs_without": on / off,
        "progress_rows_per_job": rows / (2 * jobs),
    }
