"""The S15 chaos proxy (bench/chaos_partition.py) itself: in-order delivery under delay, a
blackhole that holds bytes without a reset, and heal. The scenario is chaos-only."""

from __future__ import annotations

import socket
import socketserver
import threading
from collections.abc import Iterator

import pytest
from bench.chaos_partition import Proxy


class _Echo(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        for line in self.rfile:
            self.wfile.write(line)


@pytest.fixture
def proxy() -> Iterator[Proxy]:
    """A proxy in front of a line echo server on 127.0.0.1."""
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    front = Proxy(server.server_address[1])
    yield front
    front.close()
    server.shutdown()
    server.server_close()


def read_lines(conn: socket.socket, count: int) -> list[bytes]:
    got = b""
    while got.count(b"\n") < count:
        chunk = conn.recv(4096)
        assert chunk, f"connection closed after {got!r}"
        got += chunk
    return got.splitlines()


def test_delayed_chunks_arrive_whole_and_in_order(proxy: Proxy) -> None:
    proxy.set(delay_s=0.02)
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as conn:
        sent = [f"{i:04d}".encode() for i in range(200)]
        for line in sent:
            conn.sendall(line + b"\n")  # back to back: the proxy queues many chunks at once
        assert read_lines(conn, len(sent)) == sent


def test_blackhole_holds_bytes_without_reset_until_healed(proxy: Proxy) -> None:
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as conn:
        conn.sendall(b"before\n")
        assert read_lines(conn, 1) == [b"before"]  # the upstream connection exists
        proxy.set(blackhole=True)  # in force once set() returns
        conn.sendall(b"held\n")
        conn.settimeout(0.5)
        with pytest.raises(TimeoutError):  # neither the echo nor a reset or EOF comes back
            conn.recv(4096)
        proxy.set()
        conn.settimeout(10)
        assert read_lines(conn, 1) == [b"held"]
