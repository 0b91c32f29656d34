"""What `hivejobs bench` runs: the plan of the chosen scenarios, run round after round, and
the medians of their figures.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import msgspec

from hivejobs.bench import scenarios
from hivejobs.bench.environment import BenchEnvironment
from hivejobs.bench.options import BenchOptions


def run_scenarios(env: BenchEnvironment, opts: BenchOptions) -> dict[str, Any]:
    progress = scenarios.stderr_progress
    plan: list[tuple[str, Callable[[], scenarios.Figures]]] = [
        ("ceilings", lambda: scenarios.ceilings(env))
    ]
    if "enqueue" in opts.scenarios:
        plan.append(("enqueue", lambda: scenarios.enqueue(env, opts.jobs, opts.payload_bytes)))
    if "throughput" in opts.scenarios:
        for ms in opts.sweep:
            for kind in opts.handlers:
                plan.append(
                    (
                        handler_key(sweep_key(opts, ms), kind),
                        lambda ms=ms, kind=kind: scenarios.throughput(  # type: ignore[misc]
                            env,
                            opts.jobs,
                            opts.processes,
                            opts.concurrency,
                            ms,
                            opts.payload_bytes,
                            progress,
                            opts.work,
                            kind,
                        ),
                    )
                )
    if "latency" in opts.scenarios:
        for kind in opts.handlers:
            plan.append(
                (
                    handler_key("latency", kind),
                    lambda kind=kind: scenarios.latency(  # type: ignore[misc]
                        env,
                        opts.rate,
                        opts.duration,
                        opts.processes,
                        opts.concurrency,
                        progress,
                        kind,
                    ),
                )
            )
    if "chain" in opts.scenarios:
        from hivejobs.bench.chain import chain_scenario

        plan.append(("chain", lambda: chain_scenario(env, opts.processes, progress)))
    if "backlog" in opts.scenarios:
        plan.append(
            (
                "backlog",
                lambda: scenarios.backlog(
                    env, opts.backlog_jobs, opts.processes, opts.concurrency, progress
                ),
            )
        )
    if "stale-stats" in opts.scenarios:
        from hivejobs.bench.stale_stats import stale_stats

        plan.append(
            (
                "stale-stats",
                lambda: stale_stats(
                    env, opts.stale_stats_jobs, opts.processes, opts.concurrency, progress
                ),
            )
        )
    if "prune" in opts.scenarios:
        from hivejobs.bench.prune import prune_scenario

        plan.append(("prune", lambda: prune_scenario(env, opts.backlog_jobs)))
    if "limits" in opts.scenarios:  # the cost of a fleet-wide limit
        from hivejobs.bench.limits import limits_scenario

        plan.append(
            (
                "limits",
                lambda: limits_scenario(
                    env, min(opts.jobs, 10_000), opts.processes, opts.concurrency, progress
                ),
            )
        )
    if "otel" in opts.scenarios:  # tracing off, the SDK alone, the SDK with an exporter
        from hivejobs.bench.otel import otel_scenario

        plan.append(
            (
                "otel",
                lambda: otel_scenario(
                    env, min(opts.jobs, 20_000), opts.processes, opts.concurrency, progress
                ),
            )
        )
    if "batch" in opts.scenarios:  # a batch of --jobs: its callback's delay after the last
        from hivejobs.bench.batch import batch_scenario

        plan.append(
            (
                "batch",
                lambda: batch_scenario(env, opts.jobs, opts.processes, opts.concurrency, progress),
            )
        )
    if "debounce" in opts.scenarios:  # the cost of a debounced or coalesced enqueue
        from hivejobs.bench.debounce import debounce_scenario

        plan.append(("debounce", lambda: debounce_scenario(env, opts.jobs, opts.payload_bytes)))
    if "fairness" in opts.scenarios:  # a small key behind a backlog, at 1 to 10,000 keys
        from hivejobs.bench.fair import fairness_scenario

        plan.append(
            (
                "fairness",
                lambda: fairness_scenario(
                    env, opts.jobs, opts.processes, opts.concurrency, opts.work_ms, progress
                ),
            )
        )
    if "progress" in opts.scenarios:  # ctx.progress / ctx.emit, beside the same body without
        from hivejobs.bench.progress import progress_scenario

        plan.append(
            (
                "progress",
                lambda: progress_scenario(
                    env, opts.jobs, opts.processes, opts.concurrency, opts.sweep, progress
                ),
            )
        )
    runs: dict[str, list[scenarios.Figures]] = {}
    started = time.perf_counter()
    # Round after round, every scenario once per round: on a shared machine a noisy minute
    # then falls on one run of each (the `def` and `async def` rows alike), not on all the
    # runs of one.
    once = ("backlog", "stale-stats", "fairness")  # each is several long drains: run once
    total = sum(1 if name in once else opts.repeats for name, _ in plan)
    done = 0
    for i in range(opts.repeats):
        for name, fn in plan:
            repeats = 1 if name in once else opts.repeats
            if i < repeats:
                print(
                    f"{name} run {i + 1}/{repeats}{eta_text(done, total, started)}", file=sys.stderr
                )
                runs.setdefault(name, []).append(fn())
                done += 1
    medians = {name: _medians(r) for name, r in runs.items()}
    return {
        "options": msgspec.to_builtins(opts),
        "runs": runs,
        "medians": medians,
        "wall_s": time.perf_counter() - started,
    }


def eta_text(done: int, total: int, started: float) -> str:
    """The whole bench's time left, from the mean run so far (runs differ: an estimate)."""
    if done == 0:
        return f" (run 1 of {total})"
    elapsed = time.perf_counter() - started
    left = elapsed / done * (total - done)
    return f" (run {done + 1} of {total}, {elapsed:.0f} s so far, about {left:.0f} s left)"


def sweep_key(opts: BenchOptions, ms: float) -> str:
    """`throughput` without --sweep, else one name per job duration."""
    return "throughput" if len(opts.sweep) == 1 else f"throughput {opts.work} {ms:g} ms"


def handler_key(name: str, handler: str) -> str:
    """A scenario's name for the bench job's handler kind: the name itself for `def`."""
    return name if handler == "sync" else f"{name} async"


def _medians(runs: list[scenarios.Figures]) -> scenarios.Figures:
    keys = {k for r in runs for k in r}
    return {k: statistics.median([r[k] for r in runs if k in r]) for k in sorted(keys)}
