"""Prometheus text exposition (format 0.0.4) of the fleet's metrics, and the small HTTP server
behind `hivejobs run --metrics-port`.

Counters and histograms come from Redis (metrics.py says why) at every scrape; queue depth,
scheduled, in-flight and the coordinator lease from Postgres, at most once per `probe_cache_s`
(the scrapes in between reuse those lines). The server has a bounded number
of handler threads, each connection a read timeout, and an optional bearer token
(HIVEJOBS_METRICS_TOKEN). Needs no web framework.
"""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
import socket
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Generic, TypeVar

import psycopg
import redis
from loguru import logger

from hivejobs.broker import Broker
from hivejobs.broker.fair import active_keys
from hivejobs.config import Settings
from hivejobs.logs import error_fields
from hivejobs.metrics import BUCKETS, COUNTERS, HISTOGRAMS
from hivejobs.store import Store
from hivejobs.store.dashboard import DashboardStore
from hivejobs.store.sequence import SequenceStore

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Connections served at once; one more is closed at once instead of costing a thread.
MAX_HANDLER_THREADS = 16
# A connection must send its request within this long (an idle socket holds a thread).
READ_TIMEOUT_S = 5.0
T = TypeVar("T")
# What socketserver hands a request handler (typeshed's _RequestType).
Request = socket.socket | tuple[bytes, socket.socket]


class Reused(Generic[T]):
    """`compute()`'s value, reused for `max_age_s`: a probe flood costs one backend round trip
    per interval. Owns the last value and its time, both guarded by `_lock`; callers that
    arrive while it is computed wait for that value instead of computing it again."""

    def __init__(self, max_age_s: float, compute: Callable[[], T]) -> None:
        self._max_age_s = max_age_s
        self._compute = compute
        self._lock = threading.Lock()
        self._value: T | None = None
        self._at = float("-inf")

    def get(self) -> T:
        with self._lock:
            if self._value is None or time.monotonic() - self._at >= self._max_age_s:
                self._value = self._compute()
                self._at = time.monotonic()
            return self._value


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _num(value: float) -> str:
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


def read_redis(broker: Broker) -> dict[str, str]:
    raw = broker.redis.hgetall(broker.metrics_key)
    return {k.decode(): v.decode() for k, v in raw.items()}  # type: ignore[union-attr]


def render_counters(fields: dict[str, str], out: list[str]) -> None:
    by_counter: dict[str, dict[str, float]] = defaultdict(dict)
    hist: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0] * (len(BUCKETS) + 1))
    sums: dict[tuple[str, str], float] = {}
    for field, value in fields.items():
        parts = field.split(":")
        if parts[0] == "c" and len(parts) == 3:
            by_counter[parts[1]][parts[2]] = float(value)
        elif parts[0] == "h" and len(parts) == 4 and parts[3].isdigit():
            index = int(parts[3])
            if index <= len(BUCKETS):
                hist[(parts[1], parts[2])][index] += int(value)
        elif parts[0] == "hs" and len(parts) == 3:
            sums[(parts[1], parts[2])] = float(value)
    for counter, text in COUNTERS.items():
        metric = f"hivejobs_jobs_{counter}_total"
        out += [f"# HELP {metric} {text}", f"# TYPE {metric} counter"]
        for name, count in sorted(by_counter.get(counter, {}).items()):
            out.append(f'{metric}{{job_type="{_label(name)}"}} {_num(count)}')
    for key, (metric, text) in HISTOGRAMS.items():
        out += [f"# HELP {metric} {text}", f"# TYPE {metric} histogram"]
        for (hname, name), buckets in sorted(hist.items()):
            if hname != key:
                continue
            label = _label(name)
            running = 0
            for bound, n in zip((*BUCKETS, float("inf")), buckets, strict=True):
                running += n
                le = "+Inf" if bound == float("inf") else _num(bound)
                out.append(f'{metric}_bucket{{job_type="{label}",le="{le}"}} {running}')
            out.append(f'{metric}_sum{{job_type="{label}"}} {_num(sums.get((key, name), 0.0))}')
            out.append(f'{metric}_count{{job_type="{label}"}} {running}')


def render_gauges(store: Store, out: list[str]) -> None:
    dash = DashboardStore(store)
    counts = dash.live_counts()
    for state, text in (
        ("queued", "jobs waiting in the queue (Postgres)"),
        ("scheduled", "jobs waiting for their run time or retry backoff"),
        ("running", "jobs in flight (claimed, or awaiting a status callback)"),
    ):
        metric = f"hivejobs_jobs_{state}"
        out += [f"# HELP {metric} {text}", f"# TYPE {metric} gauge"]
        for name in sorted(counts):
            out.append(f'{metric}{{job_type="{_label(name)}"}} {counts[name].get(state, 0)}')
    # Per type, never per key (keys are unbounded): `hivejobs keys TYPE` lists which.
    held = SequenceStore(store).held_counts()
    out += [
        "# HELP hivejobs_sequence_held_keys sequence_by keys held by a job failed for good",
        "# TYPE hivejobs_sequence_held_keys gauge",
    ]
    for name in sorted(held):
        out.append(f'hivejobs_sequence_held_keys{{job_type="{_label(name)}"}} {held[name]}')
    lease = store.lease_read()
    out += [
        "# HELP hivejobs_coordinator_leader 1 for the coordinator holding a valid lease",
        "# TYPE hivejobs_coordinator_leader gauge",
    ]
    if lease is not None and lease.holder is not None:
        out.append(f'hivejobs_coordinator_leader{{holder="{lease.holder}"}} {int(lease.valid)}')
    out += [
        "# HELP hivejobs_coordinator_term the lease term (grows on every change of leader)",
        "# TYPE hivejobs_coordinator_term gauge",
        f"hivejobs_coordinator_term {lease.term if lease else 0}",
    ]
    workers = store.workers()
    out += [
        "# HELP hivejobs_worker_processes live worker processes by role",
        "# TYPE hivejobs_worker_processes gauge",
    ]
    # A shared pool's process has a worker row per job type (worker/placement.py): count processes.
    roles: dict[str, set[tuple[str, int]]] = defaultdict(set)
    for w in workers:
        roles[w.role].add((w.host, w.pid))
    for role in ("pool", "coordinator"):
        out.append(f'hivejobs_worker_processes{{role="{role}"}} {len(roles[role])}')


def gauge_lines(store: Store) -> list[str]:
    out: list[str] = []
    render_gauges(store, out)
    return out


def fair_key_lines(store: Store, broker: Broker) -> list[str]:
    """Keys with ids in Redis per fair type (broker/fair.py's ring): per type, never per key,
    so a million customers make one series, not a million."""
    names = [t.name for t in store.job_types() if t.fair_by is not None]
    metric = "hivejobs_fair_active_keys"
    out = [
        f"# HELP {metric} keys of a fair_by type with jobs waiting in Redis",
        f"# TYPE {metric} gauge",
    ]
    for name in names:
        out.append(f'{metric}{{job_type="{_label(name)}"}} {active_keys(broker, name)}')
    return out


def render(store: Store, broker: Broker, gauges: Callable[[], list[str]] | None = None) -> str:
    """The whole exposition; a part whose backend fails is left out and `hivejobs_up` says
    which (a scrape never fails outright because Redis or Postgres blinked). `gauges`: the
    Postgres part's lines (reused ones), instead of reading them now."""
    out: list[str] = []
    redis_ok = pg_ok = 1
    try:
        render_counters(read_redis(broker), out)
    except redis.RedisError as exc:
        redis_ok = 0
        logger.warning("metrics: Redis unreadable", **error_fields(exc))
    try:
        out += gauges() if gauges is not None else gauge_lines(store)
    except psycopg.Error as exc:
        pg_ok = 0
        logger.warning("metrics: Postgres unreadable", **error_fields(exc))
    if pg_ok and redis_ok:
        with contextlib.suppress(psycopg.Error, redis.RedisError):  # said by hivejobs_up
            out += fair_key_lines(store, broker)
    out += [
        "# HELP hivejobs_up 1 when the backend answered this scrape",
        "# TYPE hivejobs_up gauge",
        f'hivejobs_up{{backend="redis"}} {redis_ok}',
        f'hivejobs_up{{backend="postgres"}} {pg_ok}',
    ]
    return "\n".join(out) + "\n"


class _BoundedServer(ThreadingHTTPServer):
    """ThreadingHTTPServer with at most MAX_HANDLER_THREADS handler threads: a connection
    beyond them is closed at once (a scraper retries at its next interval) instead of
    costing a thread each, so 400 idle sockets do not make 400 threads."""

    daemon_threads = True
    request_queue_size = 128  # the listen backlog: a burst of connects is taken, not stalled

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        self._slots = threading.BoundedSemaphore(MAX_HANDLER_THREADS)
        super().__init__(address, handler)

    def process_request(self, request: Request, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Request, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


class MetricsServer:
    """`hivejobs run --metrics-port`: GET /metrics on a thread of the metrics child process;
    with `token`, only for `Authorization: Bearer <token>`."""

    def __init__(self, settings: Settings, host: str, port: int, token: str = "") -> None:
        self.store = Store(settings.database_url, max_size=2)
        self.broker = Broker(settings)
        self.gauges = Reused(settings.probe_cache_s, lambda: gauge_lines(self.store))
        outer = self
        expected = f"Bearer {token}".encode()

        class Handler(BaseHTTPRequestHandler):
            timeout = READ_TIMEOUT_S  # socketserver sets it on the connection

            def do_GET(self) -> None:  # http.server's name
                if self.path.split("?", 1)[0] != "/metrics":
                    self.send_error(404, "only /metrics here")
                    return
                given = (self.headers.get("Authorization") or "").strip().encode()
                if token and not hmac.compare_digest(given, expected):
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Bearer realm="hivejobs metrics"')
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = render(outer.store, outer.broker, outer.gauges.get).encode()
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                return  # scrapes are not news

        self.httpd = _BoundedServer((host, port), Handler)
        if not token and not _loopback(host):
            logger.warning(
                "metrics: no HIVEJOBS_METRICS_TOKEN, anyone who reaches this address reads "
                "the fleet's metrics",
                host=host,
            )

    def serve(self, stop: threading.Event) -> None:
        thread = threading.Thread(target=self.httpd.serve_forever, name="metrics", daemon=True)
        thread.start()
        logger.info("metrics listening", port=self.httpd.server_address[1])
        stop.wait()
        self.httpd.shutdown()
        self.store.close()
        self.broker.close()


def _loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
