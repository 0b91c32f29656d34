"""The one percentile definition of the bench (figures, JSON, plot): Postgres' percentile_cont."""

from __future__ import annotations

import statistics

import pytest

from hivejobs.bench.percentiles import percentiles


def test_linear_between_the_closest_ranks_as_percentile_cont() -> None:
    values = [float(v) for v in range(1, 201)]
    p50, p95, p99 = percentiles(values, 50, 95, 99)
    assert p50 == statistics.median(values) == 100.5
    # rank 1 + 0.99 * 199 = 198.01: what SELECT percentile_cont(0.99) gives for 1..200
    assert p99 == pytest.approx(198.01)
    assert p95 == pytest.approx(190.05)


def test_a_single_value_is_every_percentile() -> None:
    assert percentiles([4.2], 50, 99) == [4.2, 4.2]
