#!/usr/bin/env python3
"""The tables of a sweep.sh run, in the shape of the benchmark's own published summaries.

    python3 bench/independent/native/summarize.py OUT [--copy-to bench/results/DATE-independent]

OUT is sweep.sh's folder (index.tsv: cell, rc, start, end, harness run folder). Reads each
run's summary.json (the harness's per-phase medians and peaks) and prints Markdown:
  * clean sweep: median completion rate, claim p50/p99 and queue depth of the clean phase;
  * chaos: recovery / baseline completion-rate ratio (the benchmark's Phase B measure), with
    the rate during the fault, and the harness's own chaos aggregates: seconds until the
    completion rate is back to 90 % of baseline, and `jobs_lost` (enqueued minus completed
    over the fault and the recovery, from the rates: a backlog left at the end counts);
  * pressure: stress / baseline completion-rate ratio (its Phase C measure), recovery /
    baseline, claim p99 under stress and the peak dead tuples of the system's tables.
--copy-to keeps, per cell, summary.json, manifest.json and raw.csv gzipped, plus index.tsv.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
from pathlib import Path
from typing import Any

STRESS = {
    "chaos-postgres-restart": "restart",
    "chaos-pg-backend-kill": "kills",
    "chaos-pool-exhaustion": "exhaustion",
    "chaos-crash-recovery": "kill",
    "chaos-repeated-kills": "repeated",
    "pressure-idle-in-tx": "idle_1",
    "pressure-active-readers": "readers_1",
    "pressure-high-load": "pressure_1",
}


def median(phases: dict[str, Any], phase: str, metric: str) -> float | None:
    m = phases.get(phase, {}).get("metrics", {}).get(metric)
    return None if m is None else float(m["median"])


def dead_peak(phases: dict[str, Any], phase: str) -> float | None:
    metrics = phases.get(phase, {}).get("metrics", {})
    peaks = [v["peak"] for k, v in metrics.items() if k.startswith("n_dead_tup@")]
    return float(sum(peaks)) if peaks else None


def pct(num: float | None, den: float | None) -> str:
    if num is None or not den:
        return "—"
    return f"{100 * num / den:.0f} %"


def num(value: float | None, digits: int = 0) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def load(out: Path) -> list[tuple[str, str, dict[str, Any]]]:
    rows = []
    for line in (out / "index.tsv").read_text().splitlines():
        cell, rc, _start, _end, run = line.split("\t")
        summary = Path(run) / "summary.json" if run else None
        data = json.loads(summary.read_text()) if summary and summary.exists() else {}
        rows.append((cell, rc, data))
    return rows


def tables(rows: list[tuple[str, str, dict[str, Any]]]) -> str:
    lines: list[str] = []
    clean = [r for r in rows if r[0].startswith("clean-")]
    if clean:
        lines += [
            "| cell | system | completion/s | claim p50 ms | claim p99 ms | queue depth |",
            "|---|---|---:|---:|---:|---:|",
        ]
        for cell, _rc, data in clean:
            for system, v in data.get("systems", {}).items():
                ph = v["phases"]
                lines.append(
                    f"| {cell} | {system} | {num(median(ph, 'clean_1', 'completion_rate'))} "
                    f"| {num(median(ph, 'clean_1', 'claim_p50_ms'), 1)} "
                    f"| {num(median(ph, 'clean_1', 'claim_p99_ms'), 1)} "
                    f"| {num(median(ph, 'clean_1', 'queue_depth'))} |"
                )
        lines.append("")
    faults = [r for r in rows if r[0] in STRESS]
    if faults:
        lines += [
            "| cell | system | rc | baseline/s | during/s | recovery/s | during/baseline "
            "| recovery/baseline | back ≥ 90 % after s | jobs_lost (harness) "
            "| claim p99 during ms | dead tuples peak during |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for cell, rc, data in faults:
            stress = STRESS[cell]
            for system, v in data.get("systems", {}).items():
                ph = v["phases"]
                base = median(ph, "baseline", "completion_rate")
                # The kill phase has no adapter at all: the restart phase is its 'during'.
                during_phase = "restart" if cell == "chaos-crash-recovery" else stress
                during = median(ph, during_phase, "completion_rate")
                rec = median(ph, "recovery", "completion_rate")
                recovery = ph.get("recovery", {})
                lines.append(
                    f"| {cell} | {system} | {rc} | {num(base)} | {num(during)} | {num(rec)} "
                    f"| {pct(during, base)} | {pct(rec, base)} "
                    f"| {num(recovery.get('chaos_recovery_time_s'), 1)} "
                    f"| {num(recovery.get('jobs_lost'))} "
                    f"| {num(median(ph, during_phase, 'claim_p99_ms'))} "
                    f"| {num(dead_peak(ph, stress))} |"
                )
    return "\n".join(lines)


def copy(out: Path, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy(out / "index.tsv", dest / "index.tsv")
    for line in (out / "index.tsv").read_text().splitlines():
        cell, _rc, _s, _e, run = line.split("\t")
        if not run:
            continue
        target = dest / cell
        target.mkdir(exist_ok=True)
        for name in ("summary.json", "manifest.json"):
            if (Path(run) / name).exists():
                shutil.copy(Path(run) / name, target / name)
        raw = Path(run) / "raw.csv"
        if raw.exists():
            with raw.open("rb") as src, gzip.open(target / "raw.csv.gz", "wb") as dst:
                shutil.copyfileobj(src, dst)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--copy-to", type=Path)
    args = parser.parse_args()
    print(tables(load(args.out)))
    if args.copy_to:
        copy(args.out, args.copy_to)


if __name__ == "__main__":
    main()
