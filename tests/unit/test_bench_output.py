"""`hivejobs bench`'s text for people: rows named in words with their unit, one labelled
throughput, a warning when the machine is loaded; the JSON keys stay as they are."""

from __future__ import annotations

import time

from hivejobs.bench.report import figure_label, format_report, load_warning
from hivejobs.bench.runner import eta_text


def test_rows_are_named_in_words_and_json_keys_stay() -> None:
    report = {
        "medians": {
            "throughput": {"throughput_jobs_per_s": 1234.5, "pool_rss_kib": 30000.0},
            "enqueue": {"enqueue_bulk_per_s": 50000.0},
        }
    }
    text = format_report(report)
    assert "throughput: steady drain rate, jobs per s  1,234.5" in text
    assert "enqueue bulk per s" in text and "pool rss (KiB)" in text
    assert "_per_s" not in text and "_kib" not in text
    assert "throughput_jobs_per_s" in report["medians"]["throughput"]  # the JSON's key
    assert figure_label("pg_cpu_ms_per_job") == "Postgres cpu (ms) per job"


def test_a_loaded_machine_is_said_before_the_figures() -> None:
    assert load_warning(0.5, 2) is None
    warning = load_warning(5.6, 2)
    assert warning is not None and "load average 5.6 on 2 cores" in warning


def test_each_run_says_how_many_are_left_and_about_how_long() -> None:
    started = time.perf_counter() - 30.0  # three runs took 30 s
    assert eta_text(0, 10, started) == " (run 1 of 10)"
    text = eta_text(3, 10, started)
    assert text.startswith(" (run 4 of 10, 30 s so far, about ") and text.endswith(" s left)")
    assert 69 <= float(text.split("about ")[1].split(" s")[0]) <= 71  # 7 more at 10 s each
