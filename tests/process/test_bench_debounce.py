"""The CI-size run of `hivejobs bench --scenarios debounce` (the full run's figures are in
bench/results/2026-12-06-debounce.txt): it reports every figure, leaves one job per key even
from 16 threads, and leaves nothing behind."""

from __future__ import annotations

from pathlib import Path

from hivejobs.bench.debounce import ROUNDS
from tests.process.test_bench import assert_left_nothing, run_bench

JOBS = 100


def test_debounce_scenario_reports_its_cost(admin_url: str, tmp_path: Path) -> None:
    args = ["--scenarios", "debounce", "--jobs", str(JOBS), "--repeats", "1"]
    result = run_bench(admin_url, tmp_path, *args)
    figures = result.medians("debounce")
    rates = ["plain", "debounce", "debounce_new_key", "coalesce"]
    assert all(figures[f"{v}_per_s"] > 0 for v in rates)
    assert all(figures[f"{v}_vs_plain"] > 0 for v in rates[1:])
    assert figures["debounce_16_threads_per_s"] > 0
    # One job for the debounced key (enqueued alone and from 16 threads), one per new key
    # (the warm-up's and one per timed enqueue).
    assert figures["debounce_jobs_left"] == 1 + 1 + JOBS // ROUNDS * ROUNDS
    assert_left_nothing(admin_url, result)
