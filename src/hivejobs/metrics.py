"""Fleet-wide Prometheus metrics, kept in Redis so that every forked pool process, every
instance and the API add to the same numbers.

Why Redis and not prometheus-client's multiprocess mode: that mode aggregates the files of the
processes of one machine, so `hivejobs serve` (often another machine) could not show what the
workers did, and a pool recycled under a new pid leaves files to clean up. A Redis hash is one
HINCRBY pipeline per process per second, costs Postgres nothing (its commit rate is the
bound), and any process can render it. A Redis flush resets the counters, which Prometheus'
rate() treats as a counter reset; queue depth and in-flight gauges are read from Postgres,
the truth, at scrape time.

Hash fields of ``{prefix}metrics`` (see broker/): ``c:<counter>:<type>`` counts, and
``h:<histogram>:<type>:<bucket index>`` / ``hs:<histogram>:<type>`` (sum) for histograms.
Type names cannot hold ':' (app.NAME_RE), so fields split unambiguously. Never raises into a
job's path: a Redis error keeps the increments for the next flush.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import defaultdict
from collections.abc import Iterable

import redis
from loguru import logger

from hivejobs.broker import Broker
from hivejobs.logs import error_fields
from hivejobs.records.jobs import ClaimedJob, Completion

BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
THROUGHPUT_TTL_S = 2 * 3600
# A completion's outcome, as the counter it adds to.
OUTCOME_COUNTER = {
    "succeeded": "succeeded",
    "failed": "failed",
    "retry": "retried",
    "cancelled": "cancelled",
    "suspend": "suspended",
    "await_callback": "callbacks_awaited",
}
COUNTERS = {
    "succeeded": "jobs whose last attempt succeeded",
    "failed": "jobs failed for good (no attempts left, or not retryable)",
    "retried": "attempts that failed and were scheduled again",
    "rescued": "jobs put back in the queue after their worker process died",
    "suspended": "attempts interrupted by a graceful shutdown (not counted as attempts)",
    "cancelled": "jobs that ended cancelled while running",
    "callbacks_awaited": "attempts of callback types handed to the other service",
}
HISTOGRAMS = {
    "run": ("hivejobs_job_run_seconds", "time a handler ran, per attempt"),
    "pickup": ("hivejobs_job_pickup_seconds", "from a job's due time to the claim that started it"),
}


def _bucket(value: float) -> int:
    """The index of the first bound >= value; len(BUCKETS) is +Inf."""
    return bisect.bisect_left(BUCKETS, value)


class Recorder:
    """Increments of one process, flushed to Redis once a second by its own thread.

    Owns `_counts` and `_sums` (guarded by `_lock`): swapped out whole at each flush and
    merged back if the flush fails, so no increment is counted twice or dropped on a Redis
    error (only a process death loses at most the last second)."""

    def __init__(self, broker: Broker, interval_s: float = 1.0) -> None:
        self.broker = broker
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._counts: dict[str, int] = defaultdict(int)
        self._sums: dict[str, float] = defaultdict(float)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="metrics", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.flush()

    # -- observations (any thread) -----------------------------------------------------

    def count(self, counter: str, name: str, n: int = 1) -> None:
        with self._lock:
            self._add_count(counter, name, n)

    def observe(self, histogram: str, name: str, value: float) -> None:
        with self._lock:
            self._add_observation(histogram, name, value)

    def completion(self, name: str, completion: Completion) -> None:
        outcome = completion.outcome
        counter = OUTCOME_COUNTER.get(outcome)
        with self._lock:
            if counter is not None:
                self._add_count(counter, name, 1)
            if outcome in ("succeeded", "failed"):
                self._counts[f"tp:{name}:{outcome}"] += 1

    def picked_up(self, jobs: Iterable[ClaimedJob]) -> None:
        """One observation per claimed job, under one lock for the claim's batch."""
        with self._lock:
            for job in jobs:
                self._add_observation("pickup", job.name, job.pickup_s)

    def _add_count(self, counter: str, name: str, n: int) -> None:
        """The one place a counter's field is named; called with `_lock` held."""
        self._counts[f"c:{counter}:{name}"] += n

    def _add_observation(self, histogram: str, name: str, value: float) -> None:
        """The one place a histogram's fields are named; called with `_lock` held."""
        self._counts[f"h:{histogram}:{name}:{_bucket(value)}"] += 1
        self._sums[f"hs:{histogram}:{name}"] += max(0.0, value)

    # -- flushing ----------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.flush()

    def flush(self) -> bool:
        with self._lock:
            counts, self._counts = self._counts, defaultdict(int)
            sums, self._sums = self._sums, defaultdict(float)
        if not counts and not sums:
            return True
        try:
            write(self.broker, counts, sums)
            return True
        except redis.RedisError as exc:
            with self._lock:
                for k, v in counts.items():
                    self._counts[k] += v
                for k, f in sums.items():
                    self._sums[k] += f
            logger.debug("metrics flush failed; kept for the next one", **error_fields(exc))
            return False


def write(broker: Broker, counts: dict[str, int], sums: dict[str, float]) -> None:
    """One pipeline: counters and buckets, sums, and this minute's throughput fields."""
    tp_key = broker.throughput_key(int(time.time() // 60))
    pipe = broker.redis.pipeline(transaction=False)
    for field, n in counts.items():
        if field.startswith("tp:"):
            pipe.hincrby(tp_key, field[3:], n)
        else:
            pipe.hincrby(broker.metrics_key, field, n)
    for field, f in sums.items():
        pipe.hincrbyfloat(broker.metrics_key, field, f)
    if any(k.startswith("tp:") for k in counts):
        pipe.expire(tp_key, THROUGHPUT_TTL_S)
    pipe.execute()


def bump(broker: Broker, counter: str, names: Iterable[str], outcome: str | None = None) -> None:
    """Rare events (rescues, callbacks, callback timeouts): written at once, errors logged."""
    counts: dict[str, int] = defaultdict(int)
    for name in names:
        counts[f"c:{counter}:{name}"] += 1
        if outcome is not None:
            counts[f"tp:{name}:{outcome}"] += 1
    if not counts:
        return
    try:
        write(broker, counts, {})
    except redis.RedisError as exc:
        logger.warning("metrics not recorded", counter=counter, **error_fields(exc))


def record_callback(broker: Broker, name: str, outcome: str) -> None:
    """A callback's outcome, counted as the pool counts a finished attempt."""
    counter = {"retry": "retried"}.get(outcome, outcome)
    final = outcome if outcome in ("succeeded", "failed") else None
    bump(broker, counter, [name], final)
