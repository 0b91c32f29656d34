"""The memory cap of a pool process (`max_rss_mb`).

A pool whose resident set grew past its type's cap (a leak in a handler or a library, a
fragmented heap) stops acquiring, lets its running jobs finish, suspends what is still
running at the shutdown deadline (not counted as attempts, R9) and exits to be forked again
by its supervisor: the memory goes back to the system with the process. Reads /proc only;
never stops a job itself.
"""

from __future__ import annotations

import math
import os
import time

CHECK_EVERY_S = 1.0
_PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_mb() -> float:
    """This process's resident set in MiB (Linux /proc; 0 where there is none)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE / (1 << 20)
    except (OSError, IndexError, ValueError):
        return 0.0


def checked_max_rss(max_rss_mb: float | None) -> float | None:
    """The cap of `@app.job(max_rss_mb=...)`, or a clear InvalidJobType."""
    from hivejobs.errors import InvalidJobType

    if max_rss_mb is None:
        return None
    if (
        isinstance(max_rss_mb, bool)
        or not isinstance(max_rss_mb, int | float)
        or not (0 < max_rss_mb < math.inf)
    ):
        raise InvalidJobType(f"max_rss_mb must be a positive number of MiB, not {max_rss_mb!r}")
    return float(max_rss_mb)


class MemoryCap:
    """Whether this process is over its cap, looked at no more than once a second. Used by
    the pool's main thread alone (no lock)."""

    def __init__(self, max_rss_mb: float | None) -> None:
        self.max_rss_mb = max_rss_mb
        self._next = 0.0
        self.seen_mb = 0.0

    def exceeded(self) -> bool:
        if self.max_rss_mb is None:
            return False
        now = time.monotonic()
        if now < self._next:
            return False
        self._next = now + CHECK_EVERY_S
        self.seen_mb = rss_mb()
        return self.seen_mb > self.max_rss_mb
