"""The hivejobs application the benchmark's worker runs: one job type, `bench_job`.

`main.py` starts `hivejobs run bench_app:app` with this folder on PYTHONPATH. The handler
measures pickup latency (its own start minus the wall-clock time the producer stamped in the
payload just before the enqueue call, both on this host), sleeps JOB_WORK_MS, and counts a
completion. Those figures live in the pool process; a small reporter sends them in batches
over a Unix datagram socket (HJBENCH_REPORT_SOCKET) to the adapter, which owns the histogram
and emits the samples. The reporter never blocks a handler: if the adapter is gone, or its
socket is full, values wait (bounded) and are dropped past the bound.
"""

from __future__ import annotations

import array
import asyncio
import os
import socket
import struct
import threading
import time
from typing import Any

from hivejobs import App, JobContext

WORKER_COUNT = max(1, int(os.environ.get("WORKER_COUNT", "32")))
WORK_S = max(0.0, float(os.environ.get("JOB_WORK_MS", "1")) / 1000.0)
REPORT_SOCKET = os.environ.get("HJBENCH_REPORT_SOCKET", "")
FLUSH_EVERY_S = 0.05
MAX_PENDING = 200_000  # latencies kept while the adapter cannot take them; then dropped
MAX_PER_DATAGRAM = 4096  # 16 KiB of float32, well under the default socket buffer

app = App()


class Reporter:
    """Batches this pool process's pickup latencies (ms, float32) and completions.

    Owns `_pending` and `_completed`, both guarded by `_lock`; the flusher thread is started
    by the first record in each process (a thread does not survive the supervisor's fork, so
    one started at import would be absent in the pool)."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._lock = threading.Lock()
        self._pending = array.array("f")
        self._completed = 0
        self._pid = 0

    def started(self, latency_ms: float) -> None:
        self._ensure_flusher()
        with self._lock:
            if len(self._pending) < MAX_PENDING:
                self._pending.append(latency_ms)

    def completed(self) -> None:
        with self._lock:
            self._completed += 1

    def _ensure_flusher(self) -> None:
        if self._pid == os.getpid() or not self._path:
            return
        self._pid = os.getpid()
        threading.Thread(target=self._flush_forever, name="hjbench-reporter", daemon=True).start()

    def _flush_forever(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.setblocking(False)
        while True:
            time.sleep(FLUSH_EVERY_S)
            with self._lock:
                values, self._pending = self._pending, array.array("f")
                completed, self._completed = self._completed, 0
            unsent, completed_unsent = self._send(sock, values, completed)
            with self._lock:
                # What could not be sent goes back in front, inside the bound.
                room = max(0, MAX_PENDING - len(self._pending))
                self._pending = unsent[:room] + self._pending
                self._completed += completed_unsent

    def _send(
        self, sock: socket.socket, values: array.array[float], completed: int
    ) -> tuple[array.array[float], int]:
        offset = 0
        while offset < len(values) or completed:
            chunk = values[offset : offset + MAX_PER_DATAGRAM]
            try:
                sock.sendto(struct.pack("<I", completed) + chunk.tobytes(), self._path)
            except (BlockingIOError, FileNotFoundError, ConnectionRefusedError, OSError):
                return values[offset:], completed
            offset += len(chunk)
            completed = 0
        return array.array("f"), 0


REPORTER = Reporter(REPORT_SOCKET)


async def bench_job_async(ctx: JobContext, payload: dict[str, Any]) -> None:
    """The benchmark's synthetic job: pickup latency, then JOB_WORK_MS of non-blocking work
    (as the other Python adapters' async tasks do): WORKER_COUNT tasks on the pool's loop."""
    REPORTER.started(max(0.0, (time.time() - float(payload["enqueued_at"])) * 1000.0))
    if WORK_S:
        await asyncio.sleep(WORK_S)
    REPORTER.completed()


def bench_job_threads(ctx: JobContext, payload: dict[str, Any]) -> None:
    """The same job as a plain function: WORKER_COUNT runner threads (HJBENCH_HANDLER=sync)."""
    REPORTER.started(max(0.0, (time.time() - float(payload["enqueued_at"])) * 1000.0))
    if WORK_S:
        time.sleep(WORK_S)
    REPORTER.completed()


HANDLER = os.environ.get("HJBENCH_HANDLER", "async")
app.job("bench_job", concurrency=WORKER_COUNT)(
    bench_job_threads if HANDLER == "sync" else bench_job_async
)
