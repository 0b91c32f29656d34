"""The app of the sequence process tests: `hivejobs run tests.apps.sequenceapp:app`.

Each handler writes "begin <id> <pid> <monotonic ns> <account> <i>" and "end <id> <pid>
<monotonic ns>" to the ledger (tests/apps/ledger.py: O_APPEND lines that survive kill -9):
the independent record of when each key's handlers ran, from which the tests check the order
and that no two of a key overlapped. CLOCK_MONOTONIC is one clock for every process on the
machine.

- `ordered`: sequence_by="account", 4 runners, sleeps the payload's `ms` (`ms_first` on
  the first attempt if given); a payload with `fail_first` fails its first attempt, or as a
  chain step its chain's first try of it (a retry holds the key);
- `fair_ordered` (HJ_SEQ_FAIR=1): the same with fair_by="tenant" too;
- `unordered` (HJ_SEQ_BASELINE=1): the same without sequence_by (bench/sequence.py's baseline);
- `held` (on_failure="hold") and `continued` (on_failure="continue"): one attempt each, a
  payload with `fail` fails for good.
"""

from __future__ import annotations

import os
import time
from typing import Any

from hivejobs import App, Fail, JobContext
from hivejobs.store.chains import looks_like_try_id
from tests.apps.ledger import note

app = App()


def _first_try(ctx: JobContext) -> bool:
    """A plain job's first attempt, or a chain's first try of its step (each try of a step
    is a job of one attempt, its id ending with the try's number)."""
    if looks_like_try_id(ctx.job_id):
        return ctx.job_id.rsplit(":", 1)[1] == "1"
    return ctx.attempt == 1


def _ordered(ctx: JobContext, payload: dict[str, Any]) -> None:
    note("begin", ctx.job_id, os.getpid(), time.monotonic_ns(), payload["account"], payload["i"])
    ms = payload.get("ms_first", 0) if ctx.attempt == 1 else 0
    time.sleep(float(ms or payload.get("ms", 20)) / 1000)
    note("end", ctx.job_id, os.getpid(), time.monotonic_ns())
    if payload.get("fail") or (payload.get("fail_first") and _first_try(ctx)):
        raise Fail("asked to fail") if payload.get("fail") else RuntimeError("first attempt")


app.job("ordered", concurrency=4, attempts=5, sequence_by="account")(_ordered)
# Only where a test or the bench runs them: one pool process fewer elsewhere.
if os.environ.get("HJ_SEQ_FAIR"):  # fair across tenants and in sequence per account at once
    app.job("fair_ordered", concurrency=4, attempts=5, fair_by="tenant", sequence_by="account")(
        _ordered
    )
if os.environ.get("HJ_SEQ_BASELINE"):  # the same body unsequenced: bench/sequence.py's baseline
    app.job("unordered", concurrency=4, attempts=5)(_ordered)
app.job("held", concurrency=4, attempts=1, sequence_by="account", on_failure="hold")(_ordered)
app.job("continued", concurrency=4, attempts=1, sequence_by="account", on_failure="continue")(
    _ordered
)
