"""`hivejobs bench --scenarios progress` at CI size: both drains run and are reported side
by side (never its timings: speed lives in bench/results/)."""

from __future__ import annotations

from pathlib import Path

from tests.process.test_bench import assert_left_nothing, run_bench


def test_progress_scenario_reports_with_and_without_side_by_side(
    admin_url: str, tmp_path: Path
) -> None:
    args = ["--scenarios", "progress", "--jobs", "200", "--repeats", "1", "--sweep", "0,1"]
    result = run_bench(admin_url, tmp_path, *args)
    figures = result.medians("progress")
    for ms in ("0ms", "1ms"):
        assert figures[f"{ms}_without_progress_jobs_per_s"] > 0
        assert figures[f"{ms}_with_progress_jobs_per_s"] > 0
        # Every job that reported left exactly its last report.
        assert figures[f"{ms}_progress_rows_per_job"] == 1.0
    assert "0ms with vs without" in result.proc.stdout  # the table
    assert_left_nothing(admin_url, result)
