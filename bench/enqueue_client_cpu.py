"""The client's own CPU cost of an enqueue, A against B: two source trees, alternated.

The store and the broker are stubbed (an insert returns at once, a push does nothing), so
what is measured is the client path alone: the type lookup, the checks, the encode, the
pipeline's steps, the outcome. On a shared machine the wall clock of a real enqueue is the
server's commit and the scheduler's noise (milliseconds); this measures what a change to
client/ can move (microseconds), as CPU time of the measuring process.

    python bench/enqueue_client_cpu.py /work/main /work/wt/branch --rounds 5

Each round runs A then B in a fresh interpreter; each run reports the best of 15 repetitions
of 5,000 `App.enqueue`, 5,000 `await App.aenqueue` and 5 x 1,000 `App.enqueue_many` (a
`{"i": n}` payload, a handler that is never run). Prints every run, the medians and B / A.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time

KEYS = ("enqueue_us", "aenqueue_us", "enqueue_many_us")


def measure(tree: str) -> dict[str, float]:
    """In this interpreter, on `tree`'s hivejobs (its src/ first on the path)."""
    sys.path.insert(0, os.path.join(tree, "src"))
    import hivejobs
    from hivejobs import App
    from hivejobs.client import aio
    from hivejobs.records.dispatch import Push
    from hivejobs.records.jobs import Inserted

    if not hivejobs.__file__ or not hivejobs.__file__.startswith(tree):
        raise SystemExit(f"imported {hivejobs.__file__}, not {tree}'s")

    class Store:
        def insert_job(self, job, explicit_id, raw=None):
            return Inserted(job.id, job.name, "queued", job.priority, job.payload, True)

        def insert_many(self, jobs, raw=None):
            return [Push(j.id, j.name, j.priority) for j in jobs]

    class AsyncStore:
        async def insert_job(self, job, explicit_id, raw=None):
            return Store().insert_job(job, explicit_id)

    class Broker:
        def push(self, name: str, priority: int, ids: object) -> None:
            pass

    class AsyncBroker:
        async def push(self, name: str, priority: int, ids: object) -> None:
            pass

    class Pusher:
        def submit(self, name: str, priority: int, ids: object) -> None:
            pass

    async def open_stubs(settings):
        return aio.AsyncBackends(AsyncStore(), AsyncBroker())

    aio._open = open_stubs  # the real per-loop cache, stub backends
    app = App(database_url="postgresql://x@127.0.0.1:1/x", redis_url="redis://127.0.0.1:1/0")
    app.job("noop")(lambda ctx, payload: None)
    c = app.connections
    c._store, c._broker, c._pusher = Store(), Broker(), Pusher()
    n = 5_000

    def one() -> float:
        t = time.process_time()
        for i in range(n):
            app.enqueue("noop", {"i": i})
        return (time.process_time() - t) / n * 1e6

    async def aone() -> float:
        t = time.process_time()
        for i in range(n):
            await app.aenqueue("noop", {"i": i})
        return (time.process_time() - t) / n * 1e6

    def many() -> float:
        batch = [{"i": i} for i in range(1000)]
        t = time.process_time()
        for _ in range(5):
            app.enqueue_many("noop", batch)
        return (time.process_time() - t) / 5_000 * 1e6

    return {
        "enqueue_us": min(one() for _ in range(15)),
        "aenqueue_us": min(asyncio.run(aone()) for _ in range(15)),
        "enqueue_many_us": min(many() for _ in range(15)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child: measure this tree
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one)))
        return
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    runs: dict[str, list[dict[str, float]]] = {args.a: [], args.b: []}
    for r in range(1, args.rounds + 1):
        for tree in (args.a, args.b):
            out = subprocess.run(
                [sys.executable, __file__, args.a, args.b, "--one", tree],
                capture_output=True,
                text=True,
                check=True,
                env=env,
            ).stdout
            runs[tree].append(json.loads(out))
            print(r, tree, out.strip(), flush=True)
    for key in KEYS:
        a = statistics.median(x[key] for x in runs[args.a])
        b = statistics.median(x[key] for x in runs[args.b])
        print(f"{key:16} median A {a:7.2f}  B {b:7.2f}  B/A {b / a:.2f}")


if __name__ == "__main__":
    main()
