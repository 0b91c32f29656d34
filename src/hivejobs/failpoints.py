"""Failpoints for fault-injection tests: HIVEJOBS_FAILPOINTS="name=action[@n],...".

Read only when HIVEJOBS_TESTING=1, so production code paths never change. Actions: exit
(os._exit(137)), raise (RuntimeError, or the error class the call site names), sleep:<s>,
stop (SIGSTOP self). `@n` fires on the n-th hit only (default: the first), counted per
process; with HIVEJOBS_FAILPOINTS_ONCE_DIR set, a failpoint fires once across all processes
and restarts (a marker file records it).
"""

from __future__ import annotations

import os
import signal
import threading
import time

_lock = threading.Lock()
_hits: dict[str, int] = {}


def _parse() -> dict[str, tuple[str, int]]:
    if os.environ.get("HIVEJOBS_TESTING") != "1":
        return {}
    table = {}
    for item in filter(None, os.environ.get("HIVEJOBS_FAILPOINTS", "").split(",")):
        name, _, action = item.partition("=")
        action, _, nth = action.partition("@")
        table[name.strip()] = (action.strip(), int(nth) if nth else 1)
    return table


_TABLE = _parse()


def reload() -> None:
    """Re-read the environment (tests that set HIVEJOBS_FAILPOINTS after import)."""
    global _TABLE
    _TABLE = _parse()
    _hits.clear()


def failpoint(name: str, error: type[Exception] = RuntimeError) -> None:
    """Act if `name` is armed and this is its n-th hit; `error` is what `raise` raises (a
    call site that models a lost connection names the driver's error class)."""
    if not _TABLE or name not in _TABLE:
        return
    action, nth = _TABLE[name]
    with _lock:
        _hits[name] = _hits.get(name, 0) + 1
        if _hits[name] != nth:
            return
    once_dir = os.environ.get("HIVEJOBS_FAILPOINTS_ONCE_DIR")
    if once_dir:
        try:
            os.close(os.open(os.path.join(once_dir, name), os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return
    if action == "exit":
        os._exit(137)
    if action == "raise":
        raise error(f"failpoint {name}")
    if action.startswith("sleep:"):
        time.sleep(float(action.split(":", 1)[1]))
    if action == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
