"""The app `hivejobs bench` runs under a real `hivejobs run`: one job type with a chosen body.

Sized by environment variables the bench sets (HIVEJOBS_BENCH_PROCESSES, _CONCURRENCY,
_WORK, _WORK_MS, _HANDLER: `sync` for a `def` handler on runner threads, `async` for an
`async def` one, a task on the pool's event loop). A payload with "t" (the enqueue call's
wall time) makes the handler append its pickup latency in microseconds to
$HIVEJOBS_BENCH_DIR/latency.<pid>; nothing else is written.

The body (HIVEJOBS_BENCH_WORK) is what a real job does for _WORK_MS milliseconds, because a
no-op body hides what job duration does to claim and completion batching:
- `sleep`: time.sleep (the GIL is free, as in any blocking I/O);
- `cpu`: a busy loop holding the GIL;
- `redis`: one blocking Redis round trip (a GET), then a sleep for what is left of _WORK_MS:
  a network call of that latency. With _WORK_MS below one round trip it is the round trip.
An `async def` handler does the same with what its users write: asyncio.sleep, redis.asyncio
(`cpu` still holds the GIL, and the loop).
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import redis
import redis.asyncio

from hivejobs import App, BatchDone, JobContext

app = App()
WORK = os.environ.get("HIVEJOBS_BENCH_WORK", "sleep")
WORK_S = float(os.environ.get("HIVEJOBS_BENCH_WORK_MS", "0")) / 1000
HANDLER = os.environ.get("HIVEJOBS_BENCH_HANDLER", "sync")
OUT_DIR = os.environ.get("HIVEJOBS_BENCH_DIR", "")
_latency_fd: int | None = None
_redis: redis.Redis | None = None  # one client per process; its pool gives each thread a link
_aredis: redis.asyncio.Redis | None = None  # the same for the tasks of the pool's loop


def work() -> None:
    """The job body's work, as chosen by HIVEJOBS_BENCH_WORK and _WORK_MS."""
    global _redis
    began = time.perf_counter()
    if WORK == "redis":
        if _redis is None:
            _redis = redis.Redis.from_url(os.environ["HIVEJOBS_REDIS_URL"])
        _redis.get("hivejobs-bench:work")
        left = WORK_S - (time.perf_counter() - began)
        if left > 0:
            time.sleep(left)
    elif WORK == "cpu":
        while time.perf_counter() - began < WORK_S:
            pass
    elif WORK_S:
        time.sleep(WORK_S)


async def awork() -> None:
    """work() as an `async def` handler does it."""
    global _aredis
    began = time.perf_counter()
    if WORK == "redis":
        if _aredis is None:
            _aredis = redis.asyncio.Redis.from_url(os.environ["HIVEJOBS_REDIS_URL"])
        await _aredis.get("hivejobs-bench:work")
        left = WORK_S - (time.perf_counter() - began)
        if left > 0:
            await asyncio.sleep(left)
    elif WORK == "cpu":
        while time.perf_counter() - began < WORK_S:
            pass
    elif WORK_S:
        await asyncio.sleep(WORK_S)


def picked_up(payload: dict[str, Any]) -> None:
    """Append the pickup latency of a payload with "t" (the enqueue call's wall time)."""
    started = time.time()
    sent = payload.get("t")
    if isinstance(sent, float) and OUT_DIR:
        global _latency_fd
        if _latency_fd is None:
            _latency_fd = os.open(
                f"{OUT_DIR}/latency.{os.getpid()}", os.O_WRONLY | os.O_CREAT | os.O_APPEND
            )
        os.write(_latency_fd, b"%d\n" % int((started - sent) * 1e6))


def bench_noop(ctx: JobContext, payload: dict[str, Any]) -> None:
    """A JSON object payload (dict[str, Any] has a JSON Schema, so the limits scenario
    enqueues through the types the worker declared)."""
    picked_up(payload)
    work()


async def bench_noop_async(ctx: JobContext, payload: dict[str, Any]) -> None:
    picked_up(payload)
    await awork()


app.job(
    "bench_noop",
    processes=int(os.environ.get("HIVEJOBS_BENCH_PROCESSES", "2")),
    concurrency=int(os.environ.get("HIVEJOBS_BENCH_CONCURRENCY", "8")),
)(bench_noop_async if HANDLER == "async" else bench_noop)


@app.job("bench_step", concurrency=int(os.environ.get("HIVEJOBS_BENCH_CHAIN_CONCURRENCY", "50")))
def bench_step(ctx: JobContext, payload: dict[str, object]) -> None:
    """A chain job for the chain scenario: no work, so hops measure coordination only."""


if os.environ.get("HIVEJOBS_BENCH_LIMITS") == "1":
    # `hivejobs bench --scenarios limits` (bench/limits.py): the no-op job under each limit.
    # Open limits (never reached) price the enforcement itself; bench_rate's rate is reached.
    _processes = int(os.environ.get("HIVEJOBS_BENCH_PROCESSES", "2"))
    _concurrency = int(os.environ.get("HIVEJOBS_BENCH_CONCURRENCY", "8"))
    _rate = os.environ.get("HIVEJOBS_BENCH_RATE_LIMIT", "100/s")
    _all = _processes * _concurrency
    _p, _c = _processes, _concurrency
    app.job("bench_gc", processes=_p, concurrency=_c, global_concurrency=_all)(bench_noop)
    app.job("bench_rate_open", processes=_p, concurrency=_c, rate="1000000/s")(bench_noop)
    app.job("bench_rate", processes=_p, concurrency=_c, rate=_rate)(bench_noop)
    # A rate per customer (limit_by): each payload "customer" has its own bucket.
    _rate_by = os.environ.get("HIVEJOBS_BENCH_RATE_BY", "20/s")
    app.job("bench_rate_by", processes=_p, concurrency=_c, rate=_rate_by, limit_by="customer")(
        bench_noop
    )
    app.job(
        "bench_rate_by_open", processes=_p, concurrency=_c, rate="1000000/s", limit_by="customer"
    )(bench_noop)


def configure_otel(mode: str) -> None:
    """`hivejobs bench --scenarios otel` (bench/otel.py): set this process's global
    TracerProvider for `mode` (nothing for `off`)."""
    if mode == "off":
        return
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider()
    if mode == "exporter":  # to OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: the bench's sink
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)


if os.environ.get("HIVEJOBS_BENCH_OTEL"):
    # Each forked process of the worker sets the mode up after the fork.
    _mode = os.environ["HIVEJOBS_BENCH_OTEL"]
    app.on_process_start(lambda: configure_otel(_mode))


if os.environ.get("HIVEJOBS_BENCH_BATCH") == "1":
    # `hivejobs bench --scenarios batch` (bench/batch.py): the batch's callback, no work.
    @app.job("bench_batch_done", concurrency=1)
    def bench_batch_done(ctx: JobContext, done: BatchDone) -> None:
        """The batch scenario reads its times from the archive: nothing to record here."""


if os.environ.get("HIVEJOBS_BENCH_FAIR") == "1":
    # `hivejobs bench --scenarios fairness` (bench/fair.py): the no-op job, fair per customer.
    app.job(
        "bench_fair",
        processes=int(os.environ.get("HIVEJOBS_BENCH_PROCESSES", "2")),
        concurrency=int(os.environ.get("HIVEJOBS_BENCH_CONCURRENCY", "8")),
        fair_by="customer",
    )(bench_noop)


if os.environ.get("HIVEJOBS_BENCH_PROGRESS") == "1":
    # `hivejobs bench --scenarios progress` (bench/progress.py): one body, split in STEPS
    # steps of the job's work; `bench_progress_on` also reports each step (ctx.progress)
    # and emits one partial result, `bench_progress_off` does not.
    STEPS = 10

    def _stepped(ctx: JobContext, report: bool) -> None:
        for i in range(STEPS):
            if WORK_S:
                time.sleep(WORK_S / STEPS)
            if report:
                ctx.progress(i + 1, STEPS, note="step")
        if report:
            ctx.emit({"steps": STEPS})

    def bench_progress_off(ctx: JobContext, payload: dict[str, Any]) -> None:
        _stepped(ctx, False)

    def bench_progress_on(ctx: JobContext, payload: dict[str, Any]) -> None:
        _stepped(ctx, True)

    _p = int(os.environ.get("HIVEJOBS_BENCH_PROCESSES", "2"))
    _c = int(os.environ.get("HIVEJOBS_BENCH_CONCURRENCY", "8"))
    app.job("bench_progress_off", processes=_p, concurrency=_c)(bench_progress_off)
    app.job("bench_progress_on", processes=_p, concurrency=_c)(bench_progress_on)
