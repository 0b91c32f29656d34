"""The app of the fair-dispatch process tests: `hivejobs run tests.apps.fairapp:app`.

`fair` hands its jobs out round-robin across payload "customer"; `fifo` is the same type
without fair_by, the control; `fair_limited` is fair and runs one job per customer at a
time. Each handler writes "end <id> <customer> <monotonic ns>" to the ledger
(tests/apps/ledger.py) after sleeping the payload's `ms`: the independent record of the
order in which work finished.
"""

from __future__ import annotations

import os
import time
from typing import Any

from hivejobs import App, JobContext
from tests.apps.ledger import note

app = App()
CONCURRENCY = int(os.environ.get("HJ_FAIR_CONCURRENCY", "4"))


def _work(ctx: JobContext, payload: dict[str, Any]) -> None:
    time.sleep(float(payload.get("ms", 1)) / 1000)
    note("end", ctx.job_id, payload["customer"], time.monotonic_ns())


app.job("fair", concurrency=CONCURRENCY, fair_by="customer")(_work)
app.job("fifo", concurrency=CONCURRENCY)(_work)
# Fair and limited on the same field: a key at its cap has its ids refused by the claim, and
# they go back through the inbox to the key's list (broker/fair.py, flow.put_back).
app.job(
    "fair_limited",
    concurrency=CONCURRENCY,
    fair_by="customer",
    limit_by="customer",
    global_concurrency=1,
)(_work)
