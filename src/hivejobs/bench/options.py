"""The options of `hivejobs bench`: the scenarios, the job body, the load; their arguments
and their checks (parse_options refuses a bad one before anything is created).
"""

from __future__ import annotations

import argparse
from typing import Literal, get_args

import msgspec

from hivejobs.errors import UsageError

# The bench job's body: blocking I/O (sleep), the GIL held (cpu), one Redis round trip (redis).
WorkKind = Literal["sleep", "cpu", "redis"]
WORK_KINDS: tuple[WorkKind, ...] = get_args(WorkKind)
# The bench job's handler: a `def` on runner threads (sync) or an `async def` (async).
HandlerKind = Literal["sync", "async"]
HANDLERS: dict[str, list[HandlerKind]] = {
    "sync": ["sync"],
    "async": ["async"],
    "both": ["sync", "async"],
}
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
    work: WorkKind
    sweep: list[float]  # job durations in ms for throughput; [work_ms] without --sweep
    handlers: list[HandlerKind]  # the bench job's handler kinds for throughput and latency
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
