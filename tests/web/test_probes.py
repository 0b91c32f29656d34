"""What anyone who reaches a probe can cost: `hivejobs serve`'s public /healthz and `hivejobs
run --metrics-port`'s /metrics reuse their answer for `probe_cache_s` (a flood is one backend
round trip per interval), the metrics server holds a bounded number of threads however many
sockets sit idle on it, and it can ask for a token."""

from __future__ import annotations

import select
import socket
from collections.abc import Callable

import httpx
import psutil

from hivejobs.worker.metrics_server import MAX_HANDLER_THREADS
from tests.harness import Instance, RedisServer, free_port, wait_until
from tests.web.conftest import Server

TOKEN = "metrics-token-for-tests"
HOUR = {"HIVEJOBS_PROBE_CACHE_S": "3600"}


def test_healthz_reuses_its_answer(
    start_server: Callable[..., Server], own_redis: RedisServer
) -> None:
    """With an hour's reuse, Redis going away is not seen: no request reached it again."""
    server = start_server(env={"HIVEJOBS_REDIS_URL": own_redis.url, **HOUR})
    assert server.client.get("/healthz").json()["redis"] is True
    own_redis.stop()
    for _ in range(20):
        health = server.client.get("/healthz")
        assert health.status_code == 200 and health.json()["redis"] is True


def metrics_fleet(fleet: Callable[..., Instance], env: dict[str, str]) -> tuple[str, int]:
    port = free_port()
    fleet(env, args=["--metrics-port", str(port)])
    url = f"http://127.0.0.1:{port}/metrics"

    def up() -> bool:
        try:
            return httpx.get(url, headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(up, timeout=60, what="the metrics child")
    return url, port


def scheduled(url: str) -> str:
    text = httpx.get(url, headers={"Authorization": f"Bearer {TOKEN}"}).text
    lines = [line for line in text.splitlines() if line.startswith("hivejobs_jobs_scheduled{")]
    return "\n".join(lines)


def test_metrics_are_read_once_per_interval_and_need_the_token(
    fleet: Callable[..., Instance], server: Server
) -> None:
    url, _ = metrics_fleet(fleet, {"HIVEJOBS_METRICS_TOKEN": TOKEN, **HOUR})
    before = scheduled(url)
    for _ in range(3):
        made = server.client.post("/v1/jobs/echo", json={"data": {"text": "x"}, "delay": 3600})
        assert made.status_code == 201
    assert scheduled(url) == before  # the same answer: Postgres was not asked again
    assert httpx.get(url).status_code == 401
    assert httpx.get(url, headers={"Authorization": "Bearer guessed"}).status_code == 401


def test_idle_sockets_do_not_make_threads(fleet: Callable[..., Instance]) -> None:
    url, port = metrics_fleet(fleet, {"HIVEJOBS_METRICS_TOKEN": TOKEN})
    (child,) = [
        psutil.Process(c.pid)
        for c in psutil.net_connections("tcp")
        if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN and c.pid
    ]
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(400)]
    closed: set[socket.socket] = set()

    def closed_by_server() -> int:
        readable, _, _ = select.select([s for s in idle if s not in closed], [], [], 0)
        for sock in readable:
            try:
                if sock.recv(1) == b"":
                    closed.add(sock)
            except OSError:
                closed.add(sock)
        return len(closed)

    try:
        # Every socket is either closed at once or holds a thread: count both until all 400
        # are accounted for, then the threads are what the server chose to spend.
        wait_until(
            lambda: closed_by_server() + child.num_threads() >= 400 or child.num_threads() > 64,
            timeout=60,
            what="the server to take or refuse 400 connections",
        )
        assert child.num_threads() <= MAX_HANDLER_THREADS + 8, child.num_threads()
        # The held ones time out; a scrape gets through again.
        wait_until(lambda: closed_by_server() == 400, timeout=60, what="the read timeouts")
        assert httpx.get(url, headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    finally:
        for sock in idle:
            sock.close()
