"""`hivejobs bench`: load-test hivejobs on this machine, in a sandbox of its own.

Runs the chosen scenarios `--repeats` times and reports medians next to this machine's
ceilings measured in the same run. Speed lives here and in bench/, never in unit tests.

Layer: the top (with web, dev, testing; under cli): may import anything below; nothing
but the CLI imports it.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from hivejobs.bench import scenarios
from hivejobs.bench.environment import BenchEnvironment
from hivejobs.bench.percentiles import percentiles
from hivejobs.errors import UsageError

WORK_KINDS = ("sleep", "cpu", "redis")
HANDLERS = {"sync": ["sync"], "async": ["async"], "both": ["sync", "async"]}
SCENARIOS = (
    "enqueue",
    "throughput",
    "latency",
    "chain",
    "backlog",
    "stale-stats",
    "prune",
    "limits",
    "otel",
    "batch",
    "debounce",
    "fairness",
    "progress",
)
DEFAULT_SCENARIOS = "enqueue,throughput,latency"


class BenchOptions(msgspec.Struct, kw_only=True):
    """The checked options of `hivejobs bench` (parse_options refuses bad ones first)."""

    scenarios: list[str]
    jobs: int
    processes: int
    concurrency: int
    payload_bytes: int
    rate: float
    duration: float
    work_ms: float
    work: str
    sweep: list[float]  # job durations in ms for throughput; [work_ms] without --sweep
    handlers: list[str]  # the bench job's handler kinds for throughput and latency
    repeats: int
    backlog_jobs: int
    stale_stats_jobs: int


def add_bench_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--scenarios",
        default=DEFAULT_SCENARIOS,
        help=f"comma-separated, from {', '.join(SCENARIOS)} (default {DEFAULT_SCENARIOS})",
    )
    p.add_argument("--jobs", type=int, default=20_000, help="backlog size for throughput")
    p.add_argument("--processes", type=int, default=2, help="worker OS processes")
    p.add_argument("--concurrency", type=int, default=8, help="threads per process")
    p.add_argument("--payload-bytes", type=int, default=0, help="size of each job's payload")
    p.add_argument("--rate", type=float, default=1000.0, help="jobs/s for latency")
    p.add_argument("--duration", type=float, default=5.0, help="seconds of latency load")
    p.add_argument("--work-ms", type=float, default=0.0, help="simulated work per job")
    p.add_argument(
        "--work",
        default="sleep",
        help="the job body: sleep (blocking I/O), cpu (holds the GIL), redis (one blocking"
        " Redis round trip, then a sleep for the rest of --work-ms); default sleep",
    )
    p.add_argument(
        "--handler",
        default="both",
        help="the bench job's handler in throughput and latency: sync (a def handler on"
        " runner threads), async (an async def handler, tasks on the pool's event loop; its"
        " body awaits asyncio.sleep and redis.asyncio) or both, side by side (default both)",
    )
    p.add_argument(
        "--sweep",
        metavar="MS,MS,...",
        help="throughput at each of these job durations (replaces --work-ms), one row each",
    )
    p.add_argument("--repeats", type=int, default=3, help="runs per scenario (median)")
    p.add_argument(
        "--backlog-jobs",
        type=int,
        default=1_000_000,
        help="jobs in the backlog scenario: all enqueued, then drained by a worker",
    )
    p.add_argument(
        "--stale-stats-jobs",
        type=int,
        default=200_000,
        help="backlog drained under each planner-statistics state (stale-stats)",
    )
    p.add_argument("--json", metavar="FILE", help="write machine-readable results")
    p.add_argument("--plot", metavar="FILE.png", help="latency and throughput plot")
    p.add_argument("--database-url", help="server to bench on (a new database is made)")
    p.add_argument("--redis-url", help="Redis to bench on (a fresh key prefix is used)")
    p.add_argument("--keep", action="store_true", help="keep the bench database (debugging)")


def parse_options(args: argparse.Namespace) -> BenchOptions:
    """Check the options before anything is created; errors say which option is wrong."""
    chosen = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = [s for s in chosen if s not in SCENARIOS]
    if unknown or not chosen:
        raise UsageError(
            f"unknown scenario {unknown or chosen}: choose from {', '.join(SCENARIOS)}"
        )
    for name in ("jobs", "processes", "concurrency", "repeats", "backlog_jobs", "stale_stats_jobs"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1")
    if args.rate <= 0 or args.duration <= 0:
        raise UsageError("--rate and --duration must be positive")
    if args.work_ms < 0 or args.payload_bytes < 0:
        raise UsageError("--work-ms and --payload-bytes cannot be negative")
    if args.work not in WORK_KINDS:
        raise UsageError(f"unknown --work {args.work!r}: choose from {', '.join(WORK_KINDS)}")
    if args.handler not in HANDLERS:
        raise UsageError(f"unknown --handler {args.handler!r}: choose from {', '.join(HANDLERS)}")
    sweep = [args.work_ms]
    if args.sweep is not None:
        try:
            sweep = [float(v) for v in args.sweep.split(",") if v.strip()]
        except ValueError:
            raise UsageError(
                f"--sweep takes milliseconds like 0,0.1,1,10, not {args.sweep!r}"
            ) from None
        if not sweep or min(sweep) < 0:
            raise UsageError("--sweep needs one or more durations, none negative")
    return BenchOptions(
        scenarios=chosen,
        jobs=args.jobs,
        processes=args.processes,
        concurrency=args.concurrency,
        payload_bytes=args.payload_bytes,
        rate=args.rate,
        duration=args.duration,
        work_ms=args.work_ms,
        work=args.work,
        sweep=sweep,
        handlers=HANDLERS[args.handler],
        repeats=args.repeats,
        backlog_jobs=args.backlog_jobs,
        stale_stats_jobs=args.stale_stats_jobs,
    )


def run_bench(args: argparse.Namespace) -> int:
    opts = parse_options(args)
    from hivejobs.backends import choose_backends

    # Configured URLs, else the local servers, else embedded ones (stopped when we exit).
    chosen = choose_backends(args.database_url, args.redis_url)
    with BenchEnvironment(chosen.database_url, chosen.redis_url, keep=args.keep) as env:
        print(f"hivejobs bench on {env.describe()}, {os.cpu_count()} cores", file=sys.stderr)
        loaded = load_warning(os.getloadavg()[0], os.cpu_count() or 1)
        if loaded:
            print(loaded, file=sys.stderr)
        report = run_scenarios(env, opts)
        report["versions"] = versions(env)
    print(format_report(report))
    if args.json:
        with open(args.json, "wb") as out:
            out.write(msgspec.json.format(msgspec.json.encode(report), indent=2))
    if args.plot:
        plot(env, args.plot)
    return 0


def load_warning(load_1m: float, cores: int) -> str | None:
    """A busy machine gives lower figures (on 2 cores a load of 5.6 cost a factor of 3):
    said before the numbers, so that nobody compares them with an idle machine's."""
    if load_1m < cores:
        return None
    return (
        f"warning: load average {load_1m:.1f} on {cores} cores: other work shares this"
        " machine, so these figures will be lower than on an idle one"
    )


_UNITS = (
    ("_per_s", " per s"),
    ("_per_job", " per job"),
    ("_ms", " (ms)"),
    ("_kib", " (KiB)"),
    ("_bytes", " (bytes)"),
    ("_s", " (s)"),
)


# The one throughput the report gives, said as what it measures (the progress lines show a
# running average from the first job, ramp-up included, labelled so).
_LABELS = {"throughput_jobs_per_s": "throughput: steady drain rate, jobs per s"}


def figure_label(key: str) -> str:
    """A report key as the table shows it (`enqueue_bulk_per_s` -> `enqueue bulk per s`);
    the JSON keeps the key itself, for the tools that read it."""
    if key in _LABELS:
        return _LABELS[key]
    for suffix, unit in _UNITS:
        if key.endswith(suffix):
            return figure_label(key.removesuffix(suffix)) + unit
    return key.replace("_", " ").replace("pg ", "Postgres ")


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
                print(f"{name} run {i + 1}/{repeats}{_eta(done, total, started)}", file=sys.stderr)
                runs.setdefault(name, []).append(fn())
                done += 1
    medians = {name: _medians(r) for name, r in runs.items()}
    return {
        "options": msgspec.to_builtins(opts),
        "runs": runs,
        "medians": medians,
        "wall_s": time.perf_counter() - started,
    }


def _eta(done: int, total: int, started: float) -> str:
    """The whole bench's time left, from the mean run so far (runs differ: an estimate)."""
    if done == 0:
        return f" (run 1 of {total})"
    elapsed = time.perf_counter() - started
    left = elapsed / done * (total - done)
    return f" (run {done + 1} of {total}, {elapsed:.0f} s so far, about {left:.0f} s left)"


def sweep_key(opts: BenchOptions, ms: float) -> str:
    """`throughput` without --sweep (as before), else one name per job duration."""
    return "throughput" if len(opts.sweep) == 1 else f"throughput {opts.work} {ms:g} ms"


def handler_key(name: str, handler: str) -> str:
    """A scenario's name for the bench job's handler kind: as before for `def`."""
    return name if handler == "sync" else f"{name} async"


def _medians(runs: list[scenarios.Figures]) -> scenarios.Figures:
    keys = {k for r in runs for k in r}
    return {k: statistics.median([r[k] for r in runs if k in r]) for k in sorted(keys)}


def versions(env: BenchEnvironment) -> dict[str, Any]:
    import redis

    client = redis.Redis.from_url(env.redis_url)
    redis_version = str(client.info("server").get("redis_version"))
    client.close()
    return {
        "python": platform.python_version(),
        "postgres": env.sql("SHOW server_version")[0][0],
        "redis": redis_version,
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "hivejobs": _package_version(),
    }


def _package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("hivejobs")
    except PackageNotFoundError:
        return "unknown"


def format_report(report: dict[str, Any]) -> str:
    """One table of medians; throughput and enqueue also as a fraction of the ceilings; then
    the throughput rows (one per --sweep duration) with their Postgres cost per job."""
    med = report["medians"]
    ceil = med.get("ceilings", {})
    twins = any(name.endswith(" async") for name in med)
    head = ("figure", "median", "async def") if twins else ("figure", "median")
    rows = [(*head, "vs this machine's ceiling")]
    for name in ("ceilings", *SCENARIOS):
        figures, twin = med.get(name, {}), med.get(f"{name} async", {})
        for key in [*figures, *(k for k in twin if k not in figures)]:
            cells = [_cell(figures, key)] + ([_cell(twin, key)] if twins else [])
            value = figures.get(key, twin.get(key, 0.0))
            shown = figures if key in figures else twin
            label = figure_label(key)
            rows.append((label, *cells, _fraction(key, value, ceil) or _drift(key, shown)))
    text = "\n".join(_table(rows))
    if any(name.startswith("throughput") for name in med):
        text += "\n\n" + format_sweep(report)
    return text


def _cell(figures: scenarios.Figures, key: str) -> str:
    return f"{figures[key]:,.1f}" if key in figures else "-"


def _table(rows: Sequence[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


SWEEP_COLUMNS = (
    ("jobs/s", "throughput_jobs_per_s", 0),
    ("PG xacts/job", "pg_xacts_per_job", 3),
    ("PG CPU ms/job", "pg_cpu_ms_per_job", 3),
    ("pools ms/job", "pg_cpu_ms_per_job_pools", 3),
    ("coordinator ms/job", "pg_cpu_ms_per_job_coordinator", 3),
    ("rows written/job", "pg_rows_written_per_job", 2),
    ("buffers/job", "pg_buffers_per_job", 1),
    ("claim batch", "claim_batch", 1),
    ("completion batch", "completion_batch", 1),
)


def format_sweep(report: dict[str, Any]) -> str:
    """One row per job duration: the drain rate beside what it cost Postgres per job."""
    med = report["medians"]
    lifecycle = med.get("ceilings", {}).get("pg_batched_lifecycle_jobs_per_s")
    rows = [("job body", *(c[0] for c in SWEEP_COLUMNS), "vs batched PG life cycle")]
    for name, figures in med.items():
        if not name.startswith("throughput"):
            continue
        cells = [f"{figures[k]:,.{d}f}" if k in figures else "-" for _, k, d in SWEEP_COLUMNS]
        tp = figures.get("throughput_jobs_per_s", 0.0)
        share = f"{tp / lifecycle:.0%}" if lifecycle else "-"
        rows.append((name.removeprefix("throughput ") or name, *cells, share))
    return "\n".join(_table(rows))


def _fraction(key: str, value: float, ceil: scenarios.Figures) -> str:
    if key == "stale_stats_slowest_vs_fastest":
        return f"{value:.0%}: slowest drain rate of the four planner states vs fastest"
    if key == "enqueue_single_vs_raw":
        return f"{value:.0%} of raw 1-INSERT commits/s, slices alternated with them"
    if key == "enqueue_async_vs_sync":
        return f"{value:.0%} of sync single enqueues/s, slices alternated with them"
    if key == "throughput_jobs_per_s" and ceil.get("pg_batched_lifecycle_jobs_per_s"):
        return f"{value / ceil['pg_batched_lifecycle_jobs_per_s']:.0%} of batched PG life-cycle"
    return ""


def _drift(key: str, figures: scenarios.Figures) -> str:
    """Backlog figures at the end as a fraction of the same figure at the start."""
    start = {
        "backlog_rate_end_per_s": "backlog_rate_start_per_s",
        "backlog_pool_rss_end_kib": "backlog_pool_rss_start_kib",
        "backlog_hot_table_bytes_end": "backlog_hot_table_bytes_empty",
    }.get(key)
    if start is None or not figures.get(start):
        return ""
    return f"{figures[key] / figures[start]:.0%} of {start.removeprefix('backlog_')}"


def plot(env: BenchEnvironment, path: str) -> None:
    """Throughput over time while draining, and the pickup latency distribution."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("--plot needs matplotlib: pip install 'hivejobs[plot]'", file=sys.stderr)
        return
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for label, curve in env.drain_curves.items():
        # jobs/s between successive samples, at the later sample's time
        rates = [
            (t1, (d1 - d0) / (t1 - t0))
            for (t0, d0), (t1, d1) in zip(curve, curve[1:], strict=False)
            if t1 > t0
        ]
        if rates:
            left.plot([t for t, _ in rates], [r for _, r in rates], label=label)
    left.set(title="throughput while draining", xlabel="seconds", ylabel="jobs/s")
    if env.drain_curves:
        left.legend()
    if env.latencies_ms:
        values = sorted(env.latencies_ms)
        right.hist(values, bins=100, range=(0, values[int(len(values) * 0.999) - 1] * 1.1))
        for pct, v in zip((50, 99), percentiles(values, 50, 99), strict=True):
            right.axvline(v, color="k", linestyle=":", label=f"p{pct} {v:.2f} ms")
        right.legend()
    right.set(title="pickup latency (enqueue call to handler start)", xlabel="ms", ylabel="jobs")
    fig.tight_layout()
    fig.savefig(path)
    print(f"wrote {path}", file=sys.stderr)
