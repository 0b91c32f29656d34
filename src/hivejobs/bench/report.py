"""What `hivejobs bench` prints and writes: the table of medians beside this machine's
ceilings, the throughput rows of a sweep, the versions measured, the optional plot.
Formatting only: runs nothing.
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Sequence
from typing import Any

from hivejobs.bench import scenarios
from hivejobs.bench.environment import BenchEnvironment
from hivejobs.bench.options import SCENARIOS
from hivejobs.bench.percentiles import percentiles


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
