"""`hivejobs bench --scenarios batch`: a batch of --jobs no-op jobs (100,000 for the
published figure) and the delay of its callback after its last job ended.

The same jobs are first drained without a batch, so the rate with batch membership (a
member row per job, and every completion batch counting into the one batch row under its
lock) sits beside the plain rate. Times on the database clock: the last member's finish,
the batch's completion (the same transaction, so equal), and the callback's start.
"""

from __future__ import annotations

import time

from hivejobs.bench.environment import BenchEnvironment
from hivejobs.bench.scenarios import JOB, Figures, Progress, _wait_done

CHUNK = 10_000
CALLBACK = "bench_batch_done"


def _drain_rate(env: BenchEnvironment, jobs: int) -> float:
    """Jobs per second from the first finish to the last (the steady rate)."""
    first, last = env.sql(
        "SELECT extract(epoch FROM min(finished_at)), extract(epoch FROM max(finished_at))"
        " FROM hivejobs_archive WHERE name = %s",
        (JOB,),
    )[0]
    return (jobs - 1) / max(float(last) - float(first), 1e-6)


def batch_scenario(
    env: BenchEnvironment, jobs: int, processes: int, concurrency: int, progress: Progress
) -> Figures:
    app = env.app
    assert app is not None
    env.reset_jobs()
    env.start_worker(processes, concurrency, 0.0, extra_env={"HIVEJOBS_BENCH_BATCH": "1"})
    saved = dict(app.types)
    app.types.clear()  # enqueue through the types the worker declared (with the callback)
    try:
        began = time.perf_counter()  # the pools drain while the rest is enqueued
        for offset in range(0, jobs, CHUNK):
            app.enqueue_many(JOB, [{}] * min(CHUNK, jobs - offset))
        _wait_done(env, jobs, began, "batch: plain drain", progress)
        plain_rate = _drain_rate(env, jobs)
        env.reset_jobs()

        began = time.perf_counter()
        with app.batch(on_complete=CALLBACK) as batch:
            for offset in range(0, jobs, CHUNK):
                batch.enqueue_many(JOB, [{}] * min(CHUNK, jobs - offset))
        enqueue_s = time.perf_counter() - began
        _wait_done(env, jobs + 1, began, "batch: members and callback", progress)
        batch_rate = _drain_rate(env, jobs)
        last, completed, created, started, finished = env.sql(
            "SELECT (SELECT max(finished_at) FROM hivejobs_archive WHERE name = %(job)s),"
            " b.completed_at, a.created_at, a.started_at, a.finished_at"
            " FROM hivejobs_batch b JOIN hivejobs_archive a ON a.id = b.complete_job_id"
            " WHERE b.id = %(id)s",
            {"job": JOB, "id": batch.id},
        )[0]
        runs = env.sql("SELECT count(*) FROM hivejobs_archive WHERE name = %s", (CALLBACK,))
    finally:
        app.types.clear()
        app.types.update(saved)
        env.stop_worker()
    return {
        "batch_jobs": float(jobs),
        "batch_enqueue_per_s": jobs / enqueue_s,
        "plain_drain_per_s": plain_rate,
        "batch_drain_per_s": batch_rate,
        "batch_completed_after_last_ms": (completed - last).total_seconds() * 1000,
        "batch_callback_stored_after_last_ms": (created - last).total_seconds() * 1000,
        "batch_callback_started_after_last_ms": (started - last).total_seconds() * 1000,
        "batch_callback_finished_after_last_ms": (finished - last).total_seconds() * 1000,
        "batch_callback_runs": float(runs[0][0]),
    }
