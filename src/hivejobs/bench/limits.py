"""`hivejobs bench --scenarios limits`: what a fleet-wide limit costs, and how exact a rate is.

One worker runs the no-op job under four types in turn, each draining the same backlog:
`bench_noop` (no limit), `bench_gc` (global_concurrency = processes x concurrency, so the
limit is enforced on every claim but never reached), `bench_rate_open` (a rate never
reached) and `bench_rate_by_open` (the same rate per customer, limit_by, 3 customers in
turn: a bucket read and written per customer in every claim); throughput is the steady
rate from first to last finish, as in `throughput`, and the ratios to `bench_noop` sit
beside it. Then `bench_rate` (100/s by default) runs RATE_S
seconds of work at its limit: the rate of starts achieved (first to last start, on the
database clock) divided by the target, with and without the bucket's initial burst.
"""

from __future__ import annotations

import time

from hivejobs.bench.environment import BenchEnvironment
from hivejobs.bench.scenarios import Figures, Progress, _wait_done
from hivejobs.flow import parse_rate

RATE = "100/s"
RATE_BY = "20/s"
CUSTOMERS = ("acme", "globex", "initech")
RATE_S = 20.0
OPEN = (
    ("none", "bench_noop"),
    ("global_concurrency", "bench_gc"),
    ("rate", "bench_rate_open"),
    ("rate_by", "bench_rate_by_open"),  # limit_by="customer": a bucket per customer
)


def limits_scenario(
    env: BenchEnvironment, jobs: int, processes: int, concurrency: int, progress: Progress
) -> Figures:
    assert env.app is not None
    extra = {
        "HIVEJOBS_BENCH_LIMITS": "1",
        "HIVEJOBS_BENCH_RATE_LIMIT": RATE,
        "HIVEJOBS_BENCH_RATE_BY": RATE_BY,
    }
    env.start_worker(processes, concurrency, 0.0, extra_env=extra)
    fleet = env.app
    fleet.types.clear()  # enqueue through the types the worker declared
    figures: Figures = {}
    done = 0
    for label, name in OPEN:
        if label == "rate_by":  # its payloads name their customer, in turn
            fleet.enqueue_many(name, [{"customer": CUSTOMERS[i % 3]} for i in range(jobs)])
        else:
            fleet.enqueue_many(name, [{}] * jobs)
        done += jobs
        _wait_done(env, done, time.perf_counter(), f"limits {label}", progress)
        first, last = env.sql(
            "SELECT extract(epoch FROM min(finished_at)), extract(epoch FROM max(finished_at))"
            " FROM hivejobs_archive WHERE name = %s",
            (name,),
        )[0]
        figures[f"{label}_jobs_per_s"] = (jobs - 1) / max(float(last) - float(first), 1e-6)
    for label, _ in OPEN[1:]:
        figures[f"{label}_vs_none"] = figures[f"{label}_jobs_per_s"] / figures["none_jobs_per_s"]
    target = parse_rate(RATE)
    rated = int(target * RATE_S)
    fleet.enqueue_many("bench_rate", [{}] * rated)
    done += rated
    _wait_done(env, done, time.perf_counter(), "limits rate 100/s", progress)
    first, last = env.sql(
        "SELECT extract(epoch FROM min(started_at)), extract(epoch FROM max(started_at))"
        " FROM hivejobs_archive WHERE name = 'bench_rate'"
    )[0]
    achieved = (rated - 1) / max(float(last) - float(first), 1e-6)
    # The bucket starts full: its first `burst` (one second's worth) starts come at once. The
    # steady figure counts from the end of that burst.
    burst = int(target)
    after_burst = env.sql(
        "SELECT extract(epoch FROM started_at) FROM hivejobs_archive WHERE name = 'bench_rate'"
        " ORDER BY started_at OFFSET %s LIMIT 1",
        (burst,),
    )[0][0]
    steady = (rated - burst - 1) / max(float(last) - float(after_burst), 1e-6)
    figures["rate_target_per_s"] = target
    figures["rate_achieved_per_s"] = achieved
    figures["rate_achieved_vs_target"] = achieved / target
    figures["rate_steady_vs_target"] = steady / target
    figures |= _rate_by(env, done, progress)
    env.stop_worker()
    env.reset_jobs()
    return figures


def _rate_by(env: BenchEnvironment, done: int, progress: Progress) -> Figures:
    """Each customer's steady rate of starts under limit_by + rate, beside its target."""
    assert env.app is not None
    target = parse_rate(RATE_BY)
    per = int(target * RATE_S)
    payloads = [{"customer": c} for _ in range(per) for c in CUSTOMERS]  # interleaved
    env.app.enqueue_many("bench_rate_by", payloads)
    label = f"limits rate_by {RATE_BY}"
    _wait_done(env, done + len(payloads), time.perf_counter(), label, progress)
    burst = int(target)  # the default bucket: one second's worth, spent at once
    figures: Figures = {"rate_by_target_per_s": target}
    worst = 1.0
    for c in CUSTOMERS:
        starts = [
            float(r[0])
            for r in env.sql(
                "SELECT extract(epoch FROM started_at) FROM hivejobs_archive"
                " WHERE name = 'bench_rate_by' AND convert_from(payload, 'UTF8')::jsonb"
                " ->> 'customer' = %s ORDER BY started_at",
                (c,),
            )
        ]
        # From the end of the initial burst to the last start, as rate_steady_vs_target.
        steady = (len(starts) - burst - 1) / max(starts[-1] - starts[burst], 1e-6)
        figures[f"rate_by_{c}_per_s"] = steady
        figures[f"rate_by_{c}_vs_target"] = steady / target
        worst = steady / target if abs(steady / target - 1) > abs(worst - 1) else worst
    figures["rate_by_worst_vs_target"] = worst
    return figures
