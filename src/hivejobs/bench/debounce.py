"""`hivejobs bench --scenarios debounce`: what a debounced or coalesced enqueue costs.

Single enqueue calls of the same payload, from one thread and then from THREADS threads, in
rounds that interleave the variants (so their ratios compare the same minutes of a noisy
machine): `plain` (the bench job, one INSERT), `debounce` (one key: the key row locked and
the waiting job updated, three statements in a transaction), `debounce_new_key` (a new key
each time: a window opened, key row and job inserted), `coalesce` (one key: the job locked,
merged in Python, written back). No worker runs: the windows are an hour long, and the jobs
are dropped afterwards. From THREADS threads, one key makes the enqueues wait for each
other on its row lock: that is the price of "one waiting job per key", shown beside plain
enqueues from as many threads.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from itertools import count

from hivejobs.bench.environment import BenchEnvironment
from hivejobs.bench.scenarios import JOB, Figures, payload
from hivejobs.client.app import App, JobContext
from hivejobs.debounce import Unique

WINDOW_S = 3600.0
THREADS = 16
ROUNDS = 5
TYPES = {
    "debounce": Unique(within=WINDOW_S, mode="debounce"),
    "debounce_new_key": Unique(key=["k"], within=WINDOW_S, mode="debounce"),
    "coalesce": Unique(within=WINDOW_S, mode="coalesce", merge=lambda stored, new: new),
}


def _noop(ctx: JobContext, payload: object) -> None:
    """Never runs (no worker in this scenario)."""


def _declare(app: App) -> None:
    for variant, unique in TYPES.items():
        name = f"bench_{variant}"
        if name not in app.types:
            app.job(name, unique=unique)(_noop)


def debounce_scenario(env: BenchEnvironment, jobs: int, payload_bytes: int) -> Figures:
    assert env.app is not None
    app, body = env.app, payload(payload_bytes)
    _declare(app)
    per_round = max(1, min(jobs, 2000) // ROUNDS)
    keys = count()
    new_key = "bench_debounce_new_key"
    calls: dict[str, Callable[[], object]] = {
        "plain": lambda: app.enqueue(JOB, body),
        "debounce": lambda: app.enqueue("bench_debounce", body),
        "debounce_new_key": lambda: app.enqueue(new_key, {**body, "k": next(keys)}),
        "coalesce": lambda: app.enqueue("bench_coalesce", body),
    }
    for call in calls.values():  # connections open, key rows made, outside the timing
        call()
    spent = dict.fromkeys(calls, 0.0)
    ratios: dict[str, list[float]] = {v: [] for v in calls if v != "plain"}
    threaded = {"plain": 0.0, "debounce": 0.0}
    for _ in range(ROUNDS):
        took = {v: _timed(call, per_round) for v, call in calls.items()}
        for variant, seconds in took.items():
            spent[variant] += seconds
            if variant != "plain":
                ratios[variant].append(took["plain"] / seconds)
        for variant in threaded:
            threaded[variant] += _threads(calls[variant], per_round)
    figures: Figures = {f"{v}_per_s": per_round * ROUNDS / s for v, s in spent.items()}
    figures |= {f"{v}_vs_plain": statistics.median(r) for v, r in ratios.items()}
    for variant, seconds in threaded.items():
        figures[f"{variant}_{THREADS}_threads_per_s"] = per_round * ROUNDS / seconds
    figures["debounce_vs_plain_threads"] = (
        figures[f"debounce_{THREADS}_threads_per_s"] / figures[f"plain_{THREADS}_threads_per_s"]
    )
    live = env.sql("SELECT count(*) FROM hivejobs_job WHERE name LIKE 'bench_debounce%'")
    figures["debounce_jobs_left"] = float(live[0][0])  # one per key: 1 + the new keys
    env.sql("TRUNCATE hivejobs_debounce")
    env.reset_jobs()
    env.clear_redis(keep_boot_marker=True)
    return figures


def _timed(fn: Callable[[], object], times: int) -> float:
    start = time.perf_counter()
    for _ in range(times):
        fn()
    return time.perf_counter() - start


def _threads(fn: Callable[[], object], total: int) -> float:
    """Seconds for `total` calls of fn spread over THREADS threads released together."""
    barrier = threading.Barrier(THREADS + 1)
    share = [total // THREADS + (1 if i < total % THREADS else 0) for i in range(THREADS)]

    def run(n: int) -> None:
        barrier.wait()
        for _ in range(n):
            fn()

    threads = [threading.Thread(target=run, args=(n,)) for n in share]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    return time.perf_counter() - start
