"""The app for tests/process/test_isolation.py: hostile handlers beside innocent ones.

Two job types, `a` (at-least-once, concurrency 8, one attempt) and `b` (at-most-once), with
one handler whose behaviour the payload chooses: sleep `ms` (or wait at the test's gate
`gate`, tests/apps/gate.py) and succeed, raise an error whose text
Postgres cannot store (a surrogate, as os.listdir returns for non-UTF-8 names), return or
raise something huge, or start a child process that outlives the job. Ledger lines as in
faultapp, plus `child <job_id> <pid>` for a started child. HJ_TYPES selects the types to
register (default: both).
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from typing import Any

from hivejobs import App, JobContext
from tests.apps.gate import wait_at_gate
from tests.apps.ledger import note

app = App()
SELECTED = set(filter(None, os.environ.get("HJ_TYPES", "").split(","))) or {"a", "b"}

JobPayload = dict[str, Any]


def _act(ctx: JobContext, payload: JobPayload) -> object:
    note("start", ctx.job_id, ctx.attempt, os.getpid(), time.monotonic_ns(), threading.get_ident())
    if "gate" in payload:
        wait_at_gate(str(payload["gate"]))
    else:
        time.sleep(float(str(payload.get("ms", 10))) / 1000)
    action = payload.get("do", "ok")
    size = int(str(payload.get("bytes", 0)))
    if action == "surrogate":
        note("end", ctx.job_id, ctx.attempt, "error", os.getpid())
        raise RuntimeError("file " + b"caf\xe9".decode("utf-8", "surrogateescape"))
    if action == "big_error":
        note("end", ctx.job_id, ctx.attempt, "error", os.getpid())
        raise ValueError("head " + "e" * size + " tail")
    if action == "spawn":
        child = subprocess.Popen(["sleep", "600"])  # noqa: S607 - a test's stray child
        note("child", ctx.job_id, child.pid)
    note("end", ctx.job_id, ctx.attempt, "ok", os.getpid())
    if action == "big_result":
        return "r" * size
    return action


if "a" in SELECTED:
    app.job("a", concurrency=8, attempts=1)(_act)
if "b" in SELECTED:
    app.job("b", concurrency=2, delivery="at_most_once")(_act)
