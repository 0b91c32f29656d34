"""How a child of `hivejobs run` ends: one code per reason, and what the supervisor does.

The supervisor (supervisor.py) reads these codes; pools, the coordinator and the --reload
watcher return or `os._exit` with them. A code not listed here (a signal, a failpoint's 137)
is a crash: the supervisor releases the child's claims at once (R8, in words: a child seen
dead cannot finish its jobs) and restarts it with backoff.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from enum import IntEnum

from loguru import logger


class ChildExit(IntEnum):
    """Exit codes of the supervisor's children."""

    # Recycled on purpose (a timed-out job, a pool restart, a signal): restart at once.
    RECYCLE = 0
    # An error escaped the child's main function, or its parent was already gone at start.
    CRASHED = 1
    # The heartbeat found the worker row gone: the coordinator declared this process dead
    # and rescued its claims, so anything it finished now would be fenced out anyway.
    DECLARED_DEAD = 3
    # A stopping pool could not write every finished attempt in time: the supervisor
    # releases its claims now instead of leaving them to the coordinator's rescue.
    UNWRITTEN = 4
    # A pool thread died of an unexpected error (EX_SOFTWARE): see fatal_on_error.
    THREAD_CRASHED = 70
    # `hivejobs restart` or a --reload watcher (EX_TEMPFAIL): the supervisor stops its
    # children gracefully and re-execs itself to load new code.
    RELOAD = 75


def fatal_on_error(target: Callable[[], None]) -> Callable[[], None]:
    """A pool thread that dies of an unexpected error would leave claims nobody finishes
    while the heartbeat says all is well: exit instead, so the supervisor releases them and
    starts a fresh process."""

    def guarded() -> None:
        try:
            target()
        except BaseException as exc:  # anything here is a bug or a failpoint
            logger.opt(exception=exc).critical("pool thread crashed: exiting the process")
            os._exit(ChildExit.THREAD_CRASHED)

    return guarded
