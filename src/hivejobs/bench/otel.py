"""`hivejobs bench --scenarios otel`: what OpenTelemetry costs, side by side in one run.

Three modes, each with the same no-op job body (bench_noop, work_ms 0: the per-job overhead
is all there is to see), in every round:
- `off`: the API installed, no SDK configured (tracing.py's no-op path: one check a call);
- `sdk`: an SDK TracerProvider with no span processor (spans made, then dropped);
- `exporter`: the SDK with a BatchSpanProcessor and the OTLP/HTTP exporter (protobuf),
  posting to a sink in the bench process that reads each request and answers 200: what a
  collector on the same host costs the worker, less the collector.
The global provider can be set once per process, so each mode's enqueuing runs in a child
process of its own (`python -m hivejobs.bench.otel MODE JOBS`: single enqueues timed, then
the backlog enqueued in batches), and the worker's pools configure the mode in
App.on_process_start (bench/benchapp.py's configure_otel). Drain throughput as in the
throughput scenario.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import subprocess
import sys
import threading
import time

import psutil

from hivejobs.bench.environment import BenchEnvironment
from hivejobs.bench.scenarios import JOB, Figures, Progress, _wait_done

MODES = ("off", "sdk", "exporter")
ENDPOINT = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
SINGLE = 1000  # single enqueue calls timed per mode, at most (no more than the backlog)


def otel_scenario(
    env: BenchEnvironment, jobs: int, processes: int, concurrency: int, progress: Progress
) -> Figures:
    """Per mode: the enqueuing process's CPU per single enqueue and its rate, the worker's
    CPU per job (every process of it, from the first tenth of the drain to its end: startup
    and imports left out) and its drain rate. CPU per job is the figure to compare: on a
    shared machine the rates follow the neighbours' load as much as ours."""
    figures: Figures = {}
    with _Sink() as sink:
        for mode in MODES:
            figures.update(_one_mode(env, mode, jobs, processes, concurrency, progress, sink))
    if not sink.requests:
        raise RuntimeError("otel exporter: no span reached the sink; see the worker's log")
    return figures


def _one_mode(
    env: BenchEnvironment,
    mode: str,
    jobs: int,
    processes: int,
    concurrency: int,
    progress: Progress,
    sink: _Sink,
) -> Figures:
    """One mode: its enqueues in a child process, then its worker's drain."""
    figures: Figures = {}
    enqueued = _enqueue_in_child(env, mode, jobs, sink.endpoint)
    figures[f"otel_{mode}_enqueue_single_per_s"] = enqueued["enqueue_single_per_s"]
    figures[f"otel_{mode}_enqueue_cpu_us"] = enqueued["enqueue_cpu_us"]
    total = 1 + min(SINGLE, jobs) + jobs
    started = time.perf_counter()
    extra = {"HIVEJOBS_BENCH_OTEL": mode, ENDPOINT: sink.endpoint}
    env.start_worker(processes, concurrency, 0.0, extra_env=extra)
    label = f"otel {mode}"
    _wait_archived(env, total // 10, total, started, label, progress)
    cpu_from, done_from = _worker_cpu_s(env), env.archived()
    _wait_done(env, total, started, label, progress)
    cpu_to = _worker_cpu_s(env)
    first, last = env.sql(
        "SELECT extract(epoch FROM min(finished_at)), "
        "extract(epoch FROM max(finished_at)) FROM hivejobs_archive"
    )[0]
    env.stop_worker()
    figures[f"otel_{mode}_jobs_per_s"] = (total - 1) / max(float(last) - float(first), 1e-6)
    per_job = (cpu_to - cpu_from) / max(total - done_from, 1)
    figures[f"otel_{mode}_worker_cpu_us_per_job"] = per_job * 1e6
    env.reset_jobs()
    return figures


class _Sink(http.server.ThreadingHTTPServer):
    """An OTLP/HTTP endpoint that reads each export request and answers 200 (a thread of
    the bench process: its CPU is not the worker's). Owns `requests`, counted under the
    GIL by its handler threads (an int increment)."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _SinkHandler)
        self.requests = 0
        self.endpoint = f"http://127.0.0.1:{self.server_address[1]}/v1/traces"
        self._thread = threading.Thread(target=self.serve_forever, name="otlp-sink", daemon=True)

    def __enter__(self) -> _Sink:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
        self.server_close()


class _SinkHandler(http.server.BaseHTTPRequestHandler):
    server: _Sink

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.server.requests += 1
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        """Silent: one line per export would be noise in the bench's output."""


def _wait_archived(
    env: BenchEnvironment, at_least: int, total: int, began: float, label: str, progress: Progress
) -> None:
    deadline = time.perf_counter() + 600
    while (done := env.archived()) < at_least:
        progress(label, done, total, time.perf_counter() - began)
        if time.perf_counter() > deadline or (env.worker and env.worker.poll() is not None):
            raise RuntimeError(f"{label}: {done}/{total} done; see {env.workdir}/worker.log")
        time.sleep(0.05)  # progress polling interval


def _worker_cpu_s(env: BenchEnvironment) -> float:
    """User + system CPU seconds of the worker's processes (supervisor, pools, coordinator)."""
    assert env.worker is not None
    root = psutil.Process(env.worker.pid)
    spent = 0.0
    for proc in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            times = proc.cpu_times()
            spent += times.user + times.system
    return spent


def _enqueue_in_child(
    env: BenchEnvironment, mode: str, jobs: int, endpoint: str
) -> dict[str, float]:
    child_env = dict(
        os.environ,
        HIVEJOBS_DATABASE_URL=env.database_url,
        HIVEJOBS_REDIS_URL=env.redis_url,
        HIVEJOBS_PREFIX=env.prefix,
        **{ENDPOINT: endpoint},
    )
    done = subprocess.run(
        [sys.executable, "-m", "hivejobs.bench.otel", mode, str(jobs)],
        env=child_env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"otel {mode}: enqueuing failed: {done.stderr.strip()[-2000:]}")
    said: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return said


def _child(mode: str, jobs: int) -> None:
    """In a process of its own: up to SINGLE timed enqueues of one job, then the backlog
    (the worker drains them all)."""
    from hivejobs.bench.benchapp import app, configure_otel

    configure_otel(mode)

    body = {"p": ""}
    app.enqueue(JOB, body)  # open the connections outside the timing
    started, cpu_started = time.perf_counter(), time.process_time()
    single_jobs = min(SINGLE, jobs)
    for _ in range(single_jobs):
        app.enqueue(JOB, body)
    cpu_us = (time.process_time() - cpu_started) / single_jobs * 1e6
    single = single_jobs / (time.perf_counter() - started)
    for offset in range(0, jobs, 10_000):
        app.enqueue_many(JOB, [body] * min(10_000, jobs - offset))
    app.close()
    print(json.dumps({"enqueue_single_per_s": single, "enqueue_cpu_us": cpu_us}))


if __name__ == "__main__":
    _child(sys.argv[1], int(sys.argv[2]))
