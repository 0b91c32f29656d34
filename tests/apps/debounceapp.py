"""The app of the debounce process tests: `hivejobs run tests.apps.debounceapp:app`, and the
enqueuer processes' App (`python -m tests.apps.debounceapp debounced|coalesced N`).

Each handler writes "ran <type> <id> <payload JSON>" to the ledger (tests/apps/ledger.py):
the record of what really ran, with which payload. An enqueuer process connects, says
"ready" and waits for a "go" line on stdin (the test releases all at once, once all are
ready), enqueues N jobs of one key from its threads, and prints as JSON the ids it got and
`last_start`: the latest database clock read by a thread just before its last enqueue, so
the key's last enqueue began at or after it.
"""

from __future__ import annotations

import json
import sys
import threading
from typing import Any

from hivejobs import App, JobContext, Unique
from tests.apps.ledger import note

WITHIN_S = 1.5
MAX_WAIT_S = 3.0
THREADS = 8

app = App()


def merge(stored: object, new: object) -> object:
    assert isinstance(stored, dict) and isinstance(new, dict)
    return {"key": stored["key"], "items": stored["items"] + new["items"]}


@app.job(
    "debounced",
    unique=Unique(key=["key"], within=WITHIN_S, mode="debounce", max_wait=MAX_WAIT_S),
)
def debounced(ctx: JobContext, payload: dict[str, Any]) -> None:
    note("ran", "debounced", ctx.job_id, json.dumps(payload, separators=(",", ":")))


@app.job("coalesced", unique=Unique(key=["key"], within=WITHIN_S, mode="coalesce", merge=merge))
def coalesced(ctx: JobContext, payload: dict[str, Any]) -> None:
    note("ran", "coalesced", ctx.job_id, json.dumps(payload, separators=(",", ":")))


def _clock() -> str:
    with app.connections.store.connection() as conn:
        row = conn.execute("SELECT clock_timestamp()::text").fetchone()
    assert row is not None
    return str(row[0])


def _enqueue_from_threads(name: str, first: int, count: int) -> tuple[str, list[str]]:
    """`count` enqueues of key "k" from THREADS threads released together."""
    barrier = threading.Barrier(THREADS)
    ids: list[str] = []
    last_starts: list[str] = []
    lock = threading.Lock()

    def run(t: int) -> None:
        mine = range(first + t, first + count, THREADS)
        barrier.wait()
        for i in mine:
            if i == mine[-1]:
                clock = _clock()
                with lock:
                    last_starts.append(clock)
            job_id = app.enqueue(name, {"key": "k", "items": [i]})
            with lock:
                ids.append(job_id)

    threads = [threading.Thread(target=run, args=(t,)) for t in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return max(last_starts), ids


if __name__ == "__main__":
    name, first, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    _clock()  # connected before the go, so that the processes race on the enqueues alone
    print("ready", flush=True)
    sys.stdin.readline()
    last_start, ids = _enqueue_from_threads(name, first, count)
    app.flush(10)
    print(json.dumps({"last_start": last_start, "ids": ids}))
    app.close()
