"""Shared plumbing for the peer drivers: the workload, the completion counter, process control.

This module is imported both by every driver (running in that peer's own virtualenv) and by
the peer's worker processes (where the job bodies call :func:`record`), so it only depends on
the standard library and redis-py, which every venv installs.

Completion counter: every job, in every system, calls :func:`record`, which appends
(completion time, pickup latency) to a per-process buffer; a flusher thread in that process
sends whatever accumulated while its previous send was in flight as ONE Lua script call on
the peer's own Redis db (never waiting to fill a batch). The script adds to ``peers:done``,
keeps the earliest and latest completion times and appends the latencies. That costs each
peer the same small in-process step, whatever it uses as a broker or store, needs no
peer-specific result backend, and does not let the harness's own round trips bound the
fastest systems (an earlier version made one blocking round trip per job).

A failed send is retried with backoff (a Redis restart or stall costs a pause, not counts); a
batch carries a token so a retry of a send whose reply was lost is not counted twice. A
flusher that cannot send for ``FLUSH_GIVE_UP_S`` appends the error to the file named by
``PEERS_FLUSH_ERROR_FILE`` and stops; the driver checks that file while it waits and fails
the run with that error instead of waiting for its timeout on a counter nobody sends.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import functools
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import redis
import redis.asyncio

DRIVERS_DIR = Path(__file__).resolve().parent
REDIS_URL_ENV = "PEERS_REDIS_URL"
PG_URL_ENV = "PEERS_PG_URL"
# The job's work, the same for every system: run.py sets these for the driver, whose worker
# processes inherit them. sleep: a sleep; cpu: a busy loop holding the GIL; redis: ONE Redis
# round trip (a GET on the system's own db), then a sleep for the rest of PEERS_WORK_MS (a
# network call of that latency).
WORK_ENV, WORK_MS_ENV = "PEERS_WORK", "PEERS_WORK_MS"
# Which body runs that work, written the way each system's users write it: "sync" (redis-py,
# time.sleep: a thread or process system, a hivejobs `def` handler) or "async" (redis.asyncio,
# asyncio.sleep: an asyncio system, a hivejobs `async def` handler). An asyncio system asked
# for "sync" runs the blocking body in a thread (asyncio.to_thread), never in its loop.
BODY_ENV = "PEERS_BODY"
BODIES = ("sync", "async")
# What the counter reports each job ran as: the harness refuses a run whose jobs did not run
# the body it asked for, and "sync-in-loop" (a blocking body on a running event loop, which
# serialises an asyncio worker to one job at a time) is never what it asks for.
SYNC_IN_LOOP = "sync-in-loop"
BODY_LABEL = {  # for an asyncio system's settings line
    "async": "async body (redis.asyncio, asyncio.sleep)",
    "sync": "blocking body in asyncio.to_thread",
}
DONE, FIRST, LAST, LAT = "peers:done", "peers:first", "peers:last", "peers:lat"
BATCHES = "peers:batches"  # set of the batch tokens already counted
RAN = "peers:ran"  # hash: body kind -> jobs that ran it
FLUSH_ERROR_FILE_ENV = "PEERS_FLUSH_ERROR_FILE"
# How long a flusher retries one batch before it reports failure: a Redis restart fits, and it
# is far below the run's timeout. Backoff between tries: 0.05 s doubling up to 2 s.
FLUSH_GIVE_UP_S = 30.0
FLUSH_BACKOFF_S, FLUSH_BACKOFF_MAX_S = 0.05, 2.0
# A stalled (SIGSTOPped, partitioned) Redis fails a send after this instead of hanging it.
FLUSH_SOCKET_TIMEOUT_S = 10.0

# KEYS: done, first, last, lat, batches, ran ; ARGV: token, count, earliest, latest,
# n kinds, (kind, jobs) x n, latencies... A token already in the batches set was counted by a
# send whose reply was lost: skip it.
_FLUSH_LUA = """
if redis.call('SADD', KEYS[5], ARGV[1]) == 0 then return 0 end
redis.call('INCRBY', KEYS[1], ARGV[2])
local first = redis.call('GET', KEYS[2])
if not first or tonumber(ARGV[3]) < tonumber(first) then redis.call('SET', KEYS[2], ARGV[3]) end
local last = redis.call('GET', KEYS[3])
if not last or tonumber(ARGV[4]) > tonumber(last) then redis.call('SET', KEYS[3], ARGV[4]) end
local kinds = tonumber(ARGV[5])
for i = 0, kinds - 1 do redis.call('HINCRBY', KEYS[6], ARGV[6 + 2 * i], ARGV[7 + 2 * i]) end
for i = 6 + 2 * kinds, #ARGV do redis.call('RPUSH', KEYS[4], ARGV[i]) end
return 1
"""


class _Recorder:
    """Per-process completion buffer plus the thread that flushes it (made after any fork)."""

    def __init__(self) -> None:
        self._pid = -1
        self._cond = threading.Condition()
        self._buffer: list[tuple[float, float, str]] = []

    def add(self, finished: float, latency: float, ran: str) -> None:
        if self._pid != os.getpid():  # first use in this process (or a forked child)
            self._pid = os.getpid()
            self._cond = threading.Condition()
            self._buffer = []
            threading.Thread(target=self._flush_forever, daemon=True).start()
        with self._cond:
            self._buffer.append((finished, latency, ran))
            self._cond.notify()

    def _flush_forever(self) -> None:
        """Send batches until one cannot be sent for FLUSH_GIVE_UP_S; then report and stop
        (any other exception is reported too: a silent death would hang the run)."""
        try:
            client = redis.Redis.from_url(
                os.environ[REDIS_URL_ENV],
                socket_timeout=FLUSH_SOCKET_TIMEOUT_S,
                socket_connect_timeout=FLUSH_SOCKET_TIMEOUT_S,
            )
            script = client.register_script(_FLUSH_LUA)
            flusher_id = uuid.uuid4().hex  # batch tokens: this id and a sequence number
            tokens = (f"{flusher_id}:{n}" for n in itertools.count(1))
            while True:
                with self._cond:
                    while not self._buffer:
                        self._cond.wait()
                    batch, self._buffer = self._buffer, []
                finished = [f for f, _, _ in batch]
                latencies = [lat for _, lat, _ in batch if lat >= 0]
                ran = collections.Counter(kind for _, _, kind in batch)
                args = [next(tokens), len(batch), min(finished), max(finished), len(ran)]
                args += [*itertools.chain.from_iterable(ran.items()), *latencies]
                keys = [DONE, FIRST, LAST, LAT, BATCHES, RAN]
                _send_with_retry(functools.partial(script, keys=keys, args=args))
        except BaseException as exc:  # reported, not re-raised: the report is the signal
            _report_flush_failure(exc)


def _send_with_retry(send: Callable[[], object]) -> None:
    """Call ``send`` until it succeeds, backing off between tries; re-raise the last Redis
    error once FLUSH_GIVE_UP_S have passed since the first try. Completions recorded
    meanwhile wait in the buffer for the next batch."""
    give_up_at = time.monotonic() + FLUSH_GIVE_UP_S
    backoff = FLUSH_BACKOFF_S
    while True:
        try:
            send()
            return
        except redis.RedisError as exc:
            if time.monotonic() + backoff > give_up_at:
                raise
            sys.stderr.write(f"peers counter: send failed, retry in {backoff:.2f}s: {exc!r}\n")
            time.sleep(backoff)  # backoff pacing between tries, not synchronisation
            backoff = min(backoff * 2, FLUSH_BACKOFF_MAX_S)


def _report_flush_failure(exc: BaseException) -> None:
    """Tell the driver (through the error file; Redis may be what failed) and the log."""
    line = f"pid {os.getpid()}: completion counter stopped: {type(exc).__name__}: {exc}\n"
    sys.stderr.write(line)
    path = os.environ.get(FLUSH_ERROR_FILE_ENV)
    if path:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)


_recorder = _Recorder()
_work_client: list[redis.Redis] = []  # one client per process (its pool: a link per thread)
# One asyncio client per worker process (its pool: a link per task in flight, up to 100,
# redis-py's default size); remade only when the process or its loop changes (a fork, a
# second asyncio.run). A blocking pool: a system that lets more than 100 jobs wait at once
# (pgqueuer uncapped) queues them for a link instead of failing them with "Too many
# connections", as redis-py's default pool does.
AWORK_MAX_CONNECTIONS = 100
_awork_client: list[tuple[int, asyncio.AbstractEventLoop, redis.asyncio.Redis]] = []


def _work_params() -> tuple[str, float]:
    return os.environ.get(WORK_ENV, "sleep"), float(os.environ.get(WORK_MS_ENV, "0")) / 1000


def work() -> None:
    """The blocking body's work, chosen by PEERS_WORK and PEERS_WORK_MS (default: none)."""
    kind, seconds = _work_params()
    began = time.perf_counter()
    if kind == "redis":
        if not _work_client or _work_client[0].connection_pool.pid != os.getpid():
            _work_client[:] = [redis.Redis.from_url(os.environ[REDIS_URL_ENV])]
        _work_client[0].get("peers:work")
        left = seconds - (time.perf_counter() - began)
        if left > 0:
            time.sleep(left)
    elif kind == "cpu":
        while time.perf_counter() - began < seconds:
            pass
    elif seconds:
        time.sleep(seconds)


async def awork() -> None:
    """The asyncio body's work: the same as :func:`work` with ``redis.asyncio`` and
    ``asyncio.sleep``, so the loop runs other jobs while this one waits (cpu still holds
    the GIL: CPU work is the same in either body)."""
    kind, seconds = _work_params()
    began = time.perf_counter()
    if kind == "redis":
        loop = asyncio.get_running_loop()
        if not _awork_client or _awork_client[0][:2] != (os.getpid(), loop):
            pool = redis.asyncio.BlockingConnectionPool.from_url(
                os.environ[REDIS_URL_ENV], max_connections=AWORK_MAX_CONNECTIONS
            )
            client = redis.asyncio.Redis(connection_pool=pool)
            _awork_client[:] = [(os.getpid(), loop, client)]
        await _awork_client[0][2].get("peers:work")
        left = seconds - (time.perf_counter() - began)
        if left > 0:
            await asyncio.sleep(left)
    elif kind == "cpu":
        while time.perf_counter() - began < seconds:
            pass
    elif seconds:
        await asyncio.sleep(seconds)


def _in_event_loop() -> bool:
    """True when this thread is running an event loop (a blocking body would stall it)."""
    return asyncio._get_running_loop() is not None


def job(enqueued_at: float) -> None:
    """The blocking body (thread and process systems, hivejobs `def`): its start time, the
    work, then the counter, which notes whether it ran on a thread's running event loop."""
    started = time.time()
    work()
    record(enqueued_at, started, SYNC_IN_LOOP if _in_event_loop() else "sync")


async def ajob(enqueued_at: float) -> None:
    """The body of an asyncio system's handler: the asyncio body, or with PEERS_BODY=sync the
    blocking one in a thread (what a user of an asyncio queue does with a blocking function;
    never the blocking body on the loop itself)."""
    if os.environ.get(BODY_ENV, "async") == "sync":
        await asyncio.to_thread(job, enqueued_at)
        return
    started = time.time()
    await awork()
    record(enqueued_at, started, "async")


def record(enqueued_at: float, started: float, ran: str) -> None:
    """Count one finished job that ran body ``ran``. ``enqueued_at`` > 0 marks a latency job
    (handler start minus enqueue-call start). Never blocks on the network: the flusher thread
    sends it."""
    _recorder.add(time.time(), started - enqueued_at if enqueued_at > 0 else -1.0, ran)


# --------------------------------------------------------------------------- driver side


def parse_args(needs_pg: bool = False) -> argparse.Namespace:
    """Arguments every driver accepts (run.py passes all of them).

    URLs are required, never defaulted: a default would land in Redis db 0 or some shared
    database instead of the run's own isolated one.
    """
    p = argparse.ArgumentParser()
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--redis-url", required=True)
    p.add_argument("--pg-url", required=needs_pg, default="")
    p.add_argument("--latency-jobs", type=int, default=200)
    p.add_argument("--latency-gap", type=float, default=0.020)
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--variant", default="")
    args = p.parse_args()
    # worker processes inherit these and build their app/broker from them at import time
    os.environ[REDIS_URL_ENV] = args.redis_url
    os.environ[PG_URL_ENV] = args.pg_url
    return args


def chosen_body(supported: tuple[str, ...]) -> str:
    """The body run.py asked for (PEERS_BODY; default: the first of ``supported``, the
    system's native one), exported for the worker processes. A body the system cannot run
    the way its users write it ends the driver with a message: no silent substitute."""
    body = os.environ.get(BODY_ENV) or supported[0]
    if body not in supported:
        raise SystemExit(f"this system runs only the {' or '.join(supported)} body, not {body!r}")
    os.environ[BODY_ENV] = body
    return body


def install_sigterm() -> None:
    """Turn SIGTERM into SystemExit so the driver's ``finally`` still kills its workers."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


class Workers:
    """Worker OS processes, each started in its own session so ``killpg`` reaches children.

    Output goes to a log file (not the driver's stdout, which carries the JSON result).
    """

    def __init__(self, log_path: Path) -> None:
        self.procs: list[subprocess.Popen] = []
        self.log = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.log_path = log_path
        # where a worker's completion counter reports that it stopped (see _Recorder)
        self.flush_errors = log_path.with_name(log_path.name + ".flush-errors")
        self.flush_errors.unlink(missing_ok=True)

    def start(self, cmd: list[str], cwd: Path | None = None, env: dict | None = None) -> None:
        full_env = {**os.environ, **(env or {}), FLUSH_ERROR_FILE_ENV: str(self.flush_errors)}
        path = [str(DRIVERS_DIR)] + [p for p in [full_env.get("PYTHONPATH", "")] if p]
        full_env["PYTHONPATH"] = os.pathsep.join(path)
        self.procs.append(
            subprocess.Popen(
                cmd,
                cwd=cwd or DRIVERS_DIR,
                env=full_env,
                stdin=subprocess.DEVNULL,
                stdout=self.log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )

    def cpu_ticks(self) -> dict[int, int]:
        """CPU ticks (user + system) of every process in the workers' sessions: children
        (prefork pools, consumers' workers, a supervisor's pools) count too."""
        sessions = {p.pid for p in self.procs}
        ticks = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) in sessions:  # fields[3] is the session id
                ticks[int(entry.name)] = int(fields[11]) + int(fields[12])
        return ticks

    def check_alive(self) -> None:
        """Fail fast (with the log tail) when a worker died, or a worker's completion counter
        stopped sending, instead of waiting for a timeout."""
        for p in self.procs:
            if p.poll() is not None:
                raise RuntimeError(f"worker {p.args} exited {p.returncode}: {self.tail()}")
        try:
            errors = self.flush_errors.read_text()
        except FileNotFoundError:
            return
        raise RuntimeError(f"a worker's completion counter stopped, counts are short:\n{errors}")

    def tail(self, n: int = 1500) -> str:
        self.log.flush()
        return self.log_path.read_bytes()[-n:].decode(errors="replace")

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM each process group, wait up to ``grace``, then SIGKILL what is left."""
        for p in self.procs:
            _signal_group(p, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            # children (prefork pools, forked horses) may outlive the leader: always sweep
            _signal_group(p, signal.SIGKILL)
            p.wait()
        self.procs.clear()
        self.log.close()
        self.flush_errors.unlink(missing_ok=True)


def _signal_group(p: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(p.pid, sig)
    except ProcessLookupError:
        pass


def wait_until(
    cond: Callable[[], bool],
    timeout: float,
    what: str,
    poll: float = 0.002,
    check: Callable[[], None] | None = None,
) -> None:
    """Poll ``cond`` until true; raise after ``timeout`` seconds (no blind sleeps)."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        if check is not None:
            check()
        time.sleep(poll)


def split_enqueue(jobs: int, has_bulk: bool) -> tuple[int, int]:
    """How many of the ``jobs`` to enqueue one by one, and how many with the bulk API.

    N = min(jobs, 5000) single calls, the rest bulk; when that would leave the bulk API fewer
    than half the jobs (small runs), split half and half so the bulk number still means
    something. Without a bulk API everything is enqueued one by one.
    """
    if not has_bulk:
        return jobs, 0
    single = min(jobs, 5000)
    if jobs - single < jobs // 2:
        single = jobs - jobs // 2
    return single, jobs - single


def run_workload(
    args: argparse.Namespace,
    *,
    system: str,
    version: str,
    keeps_jobs_in: str,
    enqueue_one: Callable[[float], object],
    enqueue_bulk: Callable[[list[float]], object] | None,
    start_workers: Callable[[Workers], None],
    settings: str,
    bulk_chunk: int = 1000,
    log_dir: Path | None = None,
) -> dict:
    """Run the three phases against one peer and return the result dict.

    1. enqueue: ``single`` one-by-one calls then ``bulk`` jobs via the bulk API, workers off;
    2. drain: start the workers, wait for the counter to reach ``jobs``; throughput is measured
       from the first to the last completion, wall from worker start to the last completion;
    3. pickup latency: workers idle, ``latency_jobs`` enqueued ``latency_gap`` apart.
    """
    r = redis.Redis.from_url(args.redis_url)
    r.delete(DONE, FIRST, LAST, LAT, BATCHES, RAN)
    n_single, n_bulk = split_enqueue(args.jobs, enqueue_bulk is not None)

    t0 = time.perf_counter()
    for _ in range(n_single):
        enqueue_one(0.0)
    single_rate = n_single / (time.perf_counter() - t0)

    bulk_rate = None
    if n_bulk:
        t0 = time.perf_counter()
        for i in range(0, n_bulk, bulk_chunk):
            enqueue_bulk([0.0] * min(bulk_chunk, n_bulk - i))
        bulk_rate = n_bulk / (time.perf_counter() - t0)

    log_path = (log_dir or Path("/tmp")) / f"peers-{system}-{os.getpid()}.log"
    workers = Workers(log_path)
    ticks_before = pg_backend_ticks(args.pg_url)
    try:
        started = time.time()
        start_workers(workers)

        def drained(target: int) -> Callable[[], bool]:
            return lambda: int(r.get(DONE) or 0) >= target

        # Worker CPU from the first completion on, as the throughput: start-up is left out.
        wait_until(drained(1), args.timeout, "a first completion", check=workers.check_alive)
        worker_before = workers.cpu_ticks()
        wait_until(
            drained(args.jobs), args.timeout, f"{args.jobs} completions", check=workers.check_alive
        )
        worker_ticks = workers.cpu_ticks()
        done_then = int(r.get(DONE) or 0)
        ticks = pg_backend_ticks(args.pg_url)  # before the workers end (and their backends)
        pg_cpu_s = sum(t - ticks_before.get(pid, 0) for pid, t in ticks.items()) / os.sysconf(
            "SC_CLK_TCK"
        )
        first, last = float(r.get(FIRST)), float(r.get(LAST))
        throughput = (args.jobs - 1) / (last - first) if last > first else None
        wall = last - started

        # pickup latency: paced enqueues against idle workers (pacing, not synchronization)
        base = time.perf_counter()
        for i in range(args.latency_jobs):
            delay = base + i * args.latency_gap - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            enqueue_one(time.time())
        wait_until(
            lambda: r.llen(LAT) >= args.latency_jobs, 60, "latency jobs", check=workers.check_alive
        )
        lat_ms = sorted(float(x) * 1000 for x in r.lrange(LAT, 0, -1))
        # more completions than jobs means a peer ran some job twice: report it, don't hide it
        completions = int(r.get(DONE) or 0)
        ran = {k.decode(): int(v) for k, v in r.hgetall(RAN).items()}
    except BaseException:
        sys.stderr.write(f"--- {system} worker log tail ---\n{workers.tail()}\n")
        raise
    finally:
        workers.stop()
    return {
        "system": system,
        "version": version,
        "keeps_jobs_in": keeps_jobs_in,
        "settings": settings,
        "jobs": args.jobs,
        "single_enqueued": n_single,
        "bulk_enqueued": n_bulk,
        "enqueue_single_per_s": round(single_rate, 1),
        "enqueue_bulk_per_s": round(bulk_rate, 1) if bulk_rate else None,
        "throughput_per_s": round(throughput, 1) if throughput else None,
        "drain_wall_s": round(wall, 3),
        "pg_cpu_ms_per_job": round(pg_cpu_s * 1000 / args.jobs, 4) if args.pg_url else None,
        "worker_cpu_ms_per_job": round(
            sum(t - worker_before.get(pid, 0) for pid, t in worker_ticks.items())
            * 1000
            / os.sysconf("SC_CLK_TCK")
            / max(done_then - 1, 1),
            4,
        ),
        "work": f"{os.environ.get(WORK_ENV, 'sleep')} {os.environ.get(WORK_MS_ENV, '0')} ms",
        "body": os.environ.get(BODY_ENV, ""),  # the body run.py asked for
        "ran": ran,  # what the jobs reported they ran: {"async": 20200}, {"sync": ...}
        "pickup_p50_ms": round(percentile(lat_ms, 50), 2),
        "pickup_p99_ms": round(percentile(lat_ms, 99), 2),
        "latency_samples": len(lat_ms),
        "completions": completions,
    }


def pg_backend_ticks(pg_url: str) -> dict[int, int]:
    """CPU ticks (user + system, /proc/<pid>/stat) of the backends of the run's database.

    Read before the workers start and at the end of the drain: the difference is what the
    drain cost Postgres (backends that ended in between are missed: none of the measured
    systems opens a connection per job). Empty without a database or a local Postgres.
    """
    if not pg_url:
        return {}
    out = subprocess.run(
        [
            "psql",
            pg_url,
            "-tAc",
            "SELECT pid FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()",
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    ticks = {}
    for pid in out.split():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks[int(pid)] = int(fields[11]) + int(fields[12])
    return ticks


def percentile(sorted_values: list[float], pct: float) -> float:
    """Nearest-rank percentile (p99 of 200 samples is the 198th value)."""
    if not sorted_values:
        return float("nan")
    if pct == 50:
        return statistics.median(sorted_values)
    rank = max(1, -(-len(sorted_values) * pct // 100))  # ceil without math import
    return sorted_values[int(rank) - 1]


def emit(result: dict) -> None:
    """The driver's contract with run.py: exactly one JSON line on stdout."""
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
