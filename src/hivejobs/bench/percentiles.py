"""The one percentile definition of every bench figure, JSON field and plot line.

``statistics.quantiles`` with the inclusive method: linear between the two closest ranks
(p50 is the median), as Postgres' ``percentile_cont`` computes it. Before, five definitions
gave a run's PNG and JSON two different p99s.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def percentiles(values: Sequence[float], *pcts: int) -> list[float]:
    """The ``pcts`` (whole percents, 1-99) of ``values``, which must not be empty."""
    if len(values) == 1:  # quantiles() needs two points before Python 3.13
        return [float(values[0]) for _ in pcts]
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return [cuts[pct - 1] for pct in pcts]
