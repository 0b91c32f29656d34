"""Imported at start-up by the clock-skewed instance of RELIABILITY S10 only
(bench/chaos_servers.py puts this folder first on that instance's PYTHONPATH).

libfaketime skews that instance's wall clock alone (FAKETIME_DONT_FAKE_MONOTONIC=1): a faked
monotonic clock would move Python's timed waits too, whose deadlines (sem_clockwait on the
monotonic clock) libfaketime 0.9.10 does not translate, so `Event.wait(0.3)` never returned
and the instance's pools stalled. With the monotonic clock left true, that libfaketime makes
clock_nanosleep(TIMER_ABSTIME), which Python 3.11's time.sleep calls, fail with EINVAL: here
time.sleep waits with select() on the true monotonic clock instead. Never imported elsewhere.
"""

from __future__ import annotations

import select
import time


def _sleep(seconds: float) -> None:
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        select.select([], [], [], left)


time.sleep = _sleep
