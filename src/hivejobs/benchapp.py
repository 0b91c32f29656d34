"""The app `hivejobs bench` runs under a real `hivejobs run`: one no-op job type.

Sized by environment variables the bench sets (HIVEJOBS_BENCH_PROCESSES, _CONCURRENCY,
_WORK_MS). A payload with "t" (the enqueue call's wall time) makes the handler append its
pickup latency in microseconds to $HIVEJOBS_BENCH_DIR/latency.<pid>; nothing else is written.
"""

from __future__ import annotations

import os
import time

from hivejobs import App, JobContext

app = App()
WORK_S = float(os.environ.get("HIVEJOBS_BENCH_WORK_MS", "0")) / 1000
OUT_DIR = os.environ.get("HIVEJOBS_BENCH_DIR", "")
_latency_fd: int | None = None


@app.job(
    "bench_noop",
    processes=int(os.environ.get("HIVEJOBS_BENCH_PROCESSES", "2")),
    concurrency=int(os.environ.get("HIVEJOBS_BENCH_CONCURRENCY", "8")),
)
def bench_noop(ctx: JobContext, payload: dict[str, object]) -> None:
    started = time.time()
    sent = payload.get("t")
    if isinstance(sent, float) and OUT_DIR:
        global _latency_fd
        if _latency_fd is None:
            _latency_fd = os.open(
                f"{OUT_DIR}/latency.{os.getpid()}", os.O_WRONLY | os.O_CREAT | os.O_APPEND
            )
        os.write(_latency_fd, b"%d\n" % int((started - sent) * 1e6))
    if WORK_S:
        time.sleep(WORK_S)


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
