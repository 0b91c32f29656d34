#!/usr/bin/env python3
"""hivejobs adapter for the long-horizon Postgres job-queue benchmark.

Speaks the benchmark's adapter contract (CONTRIBUTING_ADAPTERS.md of
postgresql-job-queue-benchmarking): configuration from the environment, JSONL on stdout (one
descriptor line at start, then one line per metric every SAMPLE_EVERY_S, aligned to the
wall clock), logs on stderr, and on SIGTERM the pending samples flushed and exit 0 within 5 s.

What runs, all through hivejobs' public surface:
  * `App.migrate()` (what `hivejobs migrate` does) on DATABASE_URL;
  * a real worker, `hivejobs run bench_app:app`, as a child process: one job type,
    concurrency WORKER_COUNT, an async body sleeping JOB_WORK_MS. It dies with this process
    (PR_SET_PDEATHSIG), so the harness's SIGKILL of the adapter kills the worker too, as a
    machine crash would;
  * a producer paced on real elapsed time (PRODUCER_RATE, re-read each tick from
    PRODUCER_RATE_CONTROL_FILE when set, which is how the harness raises the rate in
    high-load phases), inserting with `App.enqueue_many` batches of at most
    PRODUCER_BATCH_MAX; with PRODUCER_PACING=harness it inserts what the harness's
    `ENQUEUE <n>` tokens on stdin ask for instead;
  * a depth poller (`queued` rows of the type) and the sampler.

hivejobs needs Redis besides Postgres (it is its broker; Postgres stays the truth):
REDIS_URL, default redis://127.0.0.1:6379/0, under a key prefix of this database's own
(REDIS_PREFIX to choose another), so runs on different databases never share keys.
"""

from __future__ import annotations

import array
import contextlib
import ctypes
import json
import os
import queue
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import psycopg
from hdrh.histogram import HdrHistogram

HERE = Path(__file__).resolve().parent
SYSTEM = "hivejobs"
JOB_TYPE = "bench_job"
EVENT_TABLES = ["public.hivejobs_job", "public.hivejobs_archive"]
WINDOW_S = 30.0  # the contract's rolling window for the claim percentiles
# Pickup latency in µs, 1 µs to 1 h, 3 significant figures: bounded memory whatever the rate.
HIST_RANGE = (1, 3_600_000_000, 3)
SHUTDOWN_BUDGET_S = 5.0
PR_SET_PDEATHSIG = 1


def env_int(key: str, default: int) -> int:
    value = os.environ.get(key, "").strip()
    return int(float(value)) if value else default


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def log(message: str) -> None:
    print(f"[hivejobs-bench] {message}", file=sys.stderr, flush=True)


class Emitter:
    """Writes JSONL records to stdout; one lock so the sampler and the shutdown path never
    interleave lines."""

    def __init__(self, instance_id: int) -> None:
        self.instance_id = instance_id
        self._lock = threading.Lock()

    def emit(self, record: dict[str, Any]) -> None:
        record.setdefault("instance_id", self.instance_id)
        line = json.dumps(record)
        with self._lock:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()


class WindowedLatency:
    """Pickup latencies for the rolling window, as HDR histograms.

    Owns `_current` (the histogram being filled) and `_closed` (one histogram per closed
    sample period, with its end time), both guarded by `_lock`. Memory is bounded by the
    number of periods in the window, never by the number of jobs."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._current = HdrHistogram(*HIST_RANGE)
        self._closed: deque[tuple[float, HdrHistogram]] = deque()

    def record_ms(self, values: array.array[float]) -> None:
        with self._lock:
            for value in values:
                us = min(HIST_RANGE[1], max(1, int(value * 1000.0)))
                self._current.record_value(us)

    def rotate(self, now: float) -> tuple[float, float, float]:
        """Close the current period; the p50/p95/p99 (ms) of the last WINDOW_S seconds."""
        with self._lock:
            self._closed.append((now, self._current))
            self._current = HdrHistogram(*HIST_RANGE)
            while self._closed and self._closed[0][0] <= now - WINDOW_S:
                self._closed.popleft()
            window = HdrHistogram(*HIST_RANGE)
            for _, hist in self._closed:
                window.add(hist)
        if window.get_total_count() == 0:
            return 0.0, 0.0, 0.0
        p50, p95, p99 = (window.get_value_at_percentile(p) / 1000.0 for p in (50.0, 95.0, 99.0))
        return p50, p95, p99


class Counters:
    """Jobs inserted (acknowledged by enqueue_many) and completed (handler returned), and
    the last queue depth read. Each field is written by one thread only."""

    def __init__(self) -> None:
        self.enqueued = 0
        self.completed = 0
        self.queue_depth = 0
        self.target_rate = 0.0


class Adapter:
    def __init__(self) -> None:
        self.database_url = os.environ.get("DATABASE_URL", "")
        if not self.database_url:
            raise SystemExit("DATABASE_URL must be set")
        self.redis_url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
        parsed = urlparse(self.database_url)
        self.db_name = (parsed.path or "/").lstrip("/") or "hivejobs_bench"
        self.prefix = os.environ.get("REDIS_PREFIX") or (
            f"hjbench:{parsed.hostname or 'local'}.{parsed.port or 5432}.{self.db_name}:"
        )
        self.instance_id = env_int("BENCH_INSTANCE_ID", 0)
        self.sample_every_s = max(1, env_int("SAMPLE_EVERY_S", 5))
        self.producer_mode = os.environ.get("PRODUCER_MODE", "fixed")
        self.producer_rate = env_int("PRODUCER_RATE", 800)
        self.batch_max = max(1, env_int("PRODUCER_BATCH_MAX", 128))
        self.batch_ms = max(1, env_int("PRODUCER_BATCH_MS", 10))
        self.target_depth = env_int("TARGET_DEPTH", 1000)
        self.worker_count = max(1, env_int("WORKER_COUNT", 32))
        self.work_ms = max(0, env_int("JOB_WORK_MS", 1))
        self.padding = "x" * max(0, env_int("JOB_PAYLOAD_BYTES", 256) - 64)
        self.harness_paced = (
            os.environ.get("PRODUCER_PACING", "adapter") == "harness"
            and self.producer_mode == "fixed"
        )
        self.stop = threading.Event()
        self.signalled = False  # set by the signal handler, read by the main loop
        self.out = Emitter(self.instance_id)
        self.latency = WindowedLatency()
        self.counters = Counters()
        self.tmp = tempfile.mkdtemp(prefix="hjbench-")
        self.report_path = os.path.join(self.tmp, "report.sock")
        self.worker: subprocess.Popen[bytes] | None = None
        os.environ.update(
            HIVEJOBS_DATABASE_URL=self.database_url,
            HIVEJOBS_REDIS_URL=self.redis_url,
            HIVEJOBS_PREFIX=self.prefix,
        )
        sys.path.insert(0, str(HERE))
        from bench_app import app  # the same App the worker runs: one registry, one type

        self.app = app

    # -- start ---------------------------------------------------------------------------

    def migrate(self) -> str:
        self.app.migrate()
        with psycopg.connect(self.database_url, autocommit=True) as conn:
            row = conn.execute("SELECT max(version) FROM hivejobs_schema_version").fetchone()
        return str(row[0]) if row else "unknown"

    def descriptor(self, schema_version: str) -> dict[str, Any]:
        import hivejobs

        version = getattr(hivejobs, "__version__", None) or _package_version()
        return {
            "kind": "descriptor",
            "system": SYSTEM,
            "event_tables": EVENT_TABLES,
            "extensions": [],
            "version": version + _source_revision(Path(hivejobs.__file__).resolve()),
            "schema_version": schema_version,
            "db_name": self.db_name,
            "started_at": now_iso(),
        }

    def start_worker(self) -> None:
        env = dict(os.environ)
        # One INFO line per job is hivejobs' default; the peers log nothing per job by default.
        env.setdefault("HIVEJOBS_LOG_LEVEL", "WARNING")
        env.update(
            HJBENCH_REPORT_SOCKET=self.report_path,
            WORKER_COUNT=str(self.worker_count),
            JOB_WORK_MS=str(self.work_ms),
            PYTHONPATH=os.pathsep.join(
                p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p
            ),
        )
        # stdout is the telemetry channel: the worker's output goes to stderr.
        self.worker = subprocess.Popen(
            [sys.executable, "-m", "hivejobs", "run", "bench_app:app"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=sys.stderr.fileno(),
            stderr=sys.stderr.fileno(),
            preexec_fn=_die_with_parent,
            start_new_session=True,  # signals are ours to send, not the terminal's group
        )
        log(
            f"worker pid {self.worker.pid}: hivejobs run bench_app:app, concurrency "
            f"{self.worker_count}, prefix {self.prefix}"
        )

    # -- threads -------------------------------------------------------------------------

    def receive_reports(self, sock: socket.socket) -> None:
        sock.settimeout(0.2)
        while not self.stop.is_set():
            try:
                data = sock.recv(1 << 17)
            except TimeoutError:
                continue
            except OSError:
                return
            (completed,) = struct.unpack_from("<I", data)
            values = array.array("f")
            values.frombytes(data[4:])
            self.counters.completed += completed
            if values:
                self.latency.record_ms(values)

    def produce(self, tokens: queue.Queue[int] | None) -> None:
        seq = 0
        credit = 0.0
        last = time.monotonic()
        period_s = self.batch_ms / 1000.0
        errors = ErrorLog("producer insert failed")
        while not self.stop.is_set():
            if tokens is not None:
                try:
                    count = tokens.get(timeout=0.2)
                except queue.Empty:
                    continue
                self.counters.target_rate = float(self.producer_rate)
            elif self.producer_mode == "depth-target":
                count = min(self.batch_max, self.target_depth - self.counters.queue_depth)
                if count <= 0:
                    self.stop.wait(0.05)
                    continue
            else:
                self.stop.wait(max(0.0, period_s - (time.monotonic() - last)))
                rate = self.current_rate()
                now = time.monotonic()
                # Credit on real elapsed time: a slow insert or a stall never under-offers.
                credit += rate * (now - last)
                last = now
                self.counters.target_rate = rate
                if rate <= 0:
                    credit = 0.0
                    continue
                count = min(self.batch_max, int(credit))
                if count < 1:
                    continue
                credit -= count
            stamp = time.time()
            payloads = [
                {"seq": seq + i, "enqueued_at": stamp, "padding": self.padding}
                for i in range(count)
            ]
            try:
                self.app.enqueue_many(JOB_TYPE, payloads)
            except Exception as exc:  # noqa: BLE001 - an outage: not acknowledged, not counted
                errors.report(exc)
                self.stop.wait(0.05)
                continue
            self.counters.enqueued += count
            seq += count

    def current_rate(self) -> float:
        control = os.environ.get("PRODUCER_RATE_CONTROL_FILE")
        if control:
            with contextlib.suppress(OSError, ValueError):
                return float(Path(control).read_text().strip())
        return float(self.producer_rate)

    def read_tokens(self, tokens: queue.Queue[int]) -> None:
        """`ENQUEUE <n>` lines from the harness's pacer; EOF ends the producer's supply."""
        for line in sys.stdin:
            if line.startswith("ENQUEUE "):
                with contextlib.suppress(ValueError):
                    tokens.put(int(line.split()[1]))

    def poll_depth(self) -> None:
        errors = ErrorLog("depth poll failed")
        conn: psycopg.Connection[Any] | None = None
        while not self.stop.wait(0.25 if self.producer_mode == "depth-target" else 0.5):
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(self.database_url, autocommit=True, connect_timeout=3)
                row = conn.execute(
                    "SELECT count(*) FROM hivejobs_job WHERE name = %s AND state = 'queued'",
                    (JOB_TYPE,),
                ).fetchone()
                self.counters.queue_depth = int(row[0]) if row else 0
            except psycopg.Error as exc:
                errors.report(exc)
                if conn is not None:
                    conn.close()
                conn = None
        if conn is not None:
            conn.close()

    def sample(self) -> None:
        every = self.sample_every_s
        # Clock-aligned: the first tick on the next wall-clock multiple of SAMPLE_EVERY_S.
        self.stop.wait(every - (time.time() % every))
        last_tick = time.monotonic()
        last_enq, last_cmp = self.counters.enqueued, self.counters.completed
        while not self.stop.is_set():
            last_tick, last_enq, last_cmp = self.emit_samples(last_tick, last_enq, last_cmp)
            self.stop.wait(every - (time.time() % every))
        self.emit_samples(last_tick, last_enq, last_cmp)  # the flush on SIGTERM

    def emit_samples(
        self, last_tick: float, last_enq: int, last_cmp: int
    ) -> tuple[float, int, int]:
        now = time.monotonic()
        dt = max(0.001, now - last_tick)
        enq, cmp = self.counters.enqueued, self.counters.completed
        p50, p95, p99 = self.latency.rotate(now)
        t = now_iso()
        metrics = [
            ("claim_p50_ms", p50, WINDOW_S),
            ("claim_p95_ms", p95, WINDOW_S),
            ("claim_p99_ms", p99, WINDOW_S),
            ("enqueue_rate", (enq - last_enq) / dt, float(self.sample_every_s)),
            ("completion_rate", (cmp - last_cmp) / dt, float(self.sample_every_s)),
        ]
        if self.instance_id == 0:  # global observations: replica 0 only, as the others do
            metrics += [
                ("queue_depth", float(self.counters.queue_depth), 0.0),
                ("producer_target_rate", self.counters.target_rate, 0.0),
            ]
        for metric, value, window_s in metrics:
            self.out.emit(
                {
                    "t": t,
                    "system": SYSTEM,
                    "kind": "adapter",
                    "subject_kind": "adapter",
                    "subject": "",
                    "metric": metric,
                    "value": round(value, 3),
                    "window_s": window_s,
                }
            )
        return now, enq, cmp

    # -- run -----------------------------------------------------------------------------

    def run(self) -> int:
        # The handler only raises a flag: Event.set() there could deadlock on the lock that
        # the interrupted main thread holds inside Event.wait().
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        schema_version = self.migrate()
        self.out.emit(self.descriptor(schema_version))
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        sock.bind(self.report_path)
        self.start_worker()
        tokens: queue.Queue[int] | None = queue.Queue() if self.harness_paced else None
        threads = [
            self._thread(lambda: self.receive_reports(sock), "reports"),
            self._thread(lambda: self.produce(tokens), "producer"),
            self._thread(self.poll_depth, "depth"),
            self._thread(self.sample, "sampler"),
        ]
        if tokens is not None:
            self._thread(lambda: self.read_tokens(tokens), "tokens")
        assert self.worker is not None
        rc = 0
        while not self.stop.is_set():
            time.sleep(0.1)
            if self.signalled:
                self.stop.set()
            elif self.worker.poll() is not None:
                # No restart here: a worker that exits is a result the harness must see.
                log(f"worker exited with {self.worker.returncode}; the adapter stops")
                rc = 1
                self.stop.set()
        deadline = time.monotonic() + SHUTDOWN_BUDGET_S - 1.0
        self.stop_worker(deadline)
        for thread in threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        sock.close()
        with contextlib.suppress(OSError):
            os.unlink(self.report_path)
            os.rmdir(self.tmp)
        return rc

    def _on_signal(self, signum: int, frame: object) -> None:
        self.signalled = True

    def stop_worker(self, deadline: float) -> None:
        """SIGTERM (hivejobs finishes or suspends what runs), SIGKILL at the budget's end:
        the contract gives the adapter 5 s in all."""
        worker = self.worker
        if worker is None or worker.poll() is not None:
            return
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=max(0.1, deadline - time.monotonic() - 0.5))
        except subprocess.TimeoutExpired:
            log("worker still running at the shutdown budget: SIGKILL")
            worker.kill()
            worker.wait()

    def _thread(self, target: Callable[[], None], name: str) -> threading.Thread:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        return thread


class ErrorLog:
    """At most one stderr line a second per kind of failure: an outage must not flood logs."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.last = 0.0
        self.suppressed = 0

    def report(self, exc: BaseException) -> None:
        now = time.monotonic()
        if now - self.last < 1.0:
            self.suppressed += 1
            return
        more = f" (+{self.suppressed} more)" if self.suppressed else ""
        log(f"{self.what}: {type(exc).__name__}: {str(exc).strip()[:200]}{more}")
        self.last, self.suppressed = now, 0


def _die_with_parent() -> None:
    """In the worker, before exec: SIGKILL when this adapter dies, however it dies."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("hivejobs")
    except PackageNotFoundError:
        return "unknown"


def _source_revision(package_file: Path) -> str:
    """`+g<sha>` when hivejobs is imported from a git checkout, so a run names its code."""
    try:
        sha = subprocess.run(
            ["git", "-C", str(package_file.parent), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""
    return f"+g{sha}" if sha else ""


def main() -> int:
    scenario = os.environ.get("SCENARIO", "long_horizon")
    if scenario != "long_horizon":
        log(f"SCENARIO={scenario} is not implemented; only long_horizon")
        return 2
    return Adapter().run()


if __name__ == "__main__":
    raise SystemExit(main())
