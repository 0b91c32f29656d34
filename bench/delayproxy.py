"""A TCP proxy that delays every chunk by a fixed one-way time in each direction: the stand-in
for `tc netem delay` in bench/multihost.py, because this machine's kernel has no netem
(`CONFIG_NET_SCH_NETEM is not set` and `CONFIG_MODULES is not set` in /proc/config.gz, so
`tc qdisc add ... netem` answers "Specified qdisc kind is unknown").

Each chunk read from one side is written to the other at its arrival time plus the delay, in
arrival order, without waiting for an earlier chunk's delay first: a link's latency, not a
queue that serialises. What it does not do, unlike netem: the TCP handshake and ACKs are not
delayed (the proxy terminates TCP), so a new connection costs one round trip less; a request
and its reply, which is what Postgres and Redis traffic is, pay the full round trip.

The event loop runs on select(2): epoll and poll take whole milliseconds as their timeout,
which would round a 0.5 ms delay up to 1 ms or more; select's is in microseconds. The timer
slack is set to 1 ns (prctl PR_SET_TIMERSLACK; the default 50 us made each delay about 80 us
late here). With --realtime the proxy runs under SCHED_FIFO: on this shared 2-core machine a
normal process woke up to 3-8 ms late under the other sessions' load (a 1 ms RTT measured
3.6-8.5 ms), and a link's delay should not depend on what the hosts' CPUs are doing.

    python bench/delayproxy.py --one-way-ms 0.5 --target 127.0.0.1:5432 \
        --listen 10.213.1.1:5432 --listen 10.213.2.1:5432

Prints "ready" on stdout once it listens on every address; exits on SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import ctypes
import os
import selectors
import signal
import sys


def host_port(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host, int(port)


class Direction:
    """Chunks read from one side, written to `dst` at arrival + delay, in arrival order.

    Owns `queue` ((due, bytes), due times non-decreasing since the delay is constant) and
    `timer`, the one pending flush; all on the loop's thread. Chunks that arrive before the
    upstream connection exists wait in the queue and leave once it is attached."""

    def __init__(self, loop: asyncio.AbstractEventLoop, delay_s: float) -> None:
        self.loop = loop
        self.delay_s = delay_s
        self.queue: collections.deque[tuple[float, bytes]] = collections.deque()
        self.dst: asyncio.Transport | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.ended = False

    def push(self, data: bytes) -> None:
        if not self.delay_s and self.dst is not None and not self.queue:
            self.dst.write(data)
            return
        self.queue.append((self.loop.time() + self.delay_s, data))
        self._schedule()

    def attach(self, dst: asyncio.Transport) -> None:
        self.dst = dst
        self._schedule()

    def end(self) -> None:
        """The source closed: close the destination once what is queued has left."""
        self.ended = True
        self._schedule()

    def _schedule(self) -> None:
        if self.timer is not None or self.dst is None:
            return
        if self.queue:
            self.timer = self.loop.call_at(self.queue[0][0], self._flush)
        elif self.ended:
            self.dst.close()

    def _flush(self) -> None:
        self.timer = None
        assert self.dst is not None  # scheduled only once attached
        now = self.loop.time()
        while self.queue and self.queue[0][0] <= now:
            self.dst.write(self.queue.popleft()[1])
        self._schedule()


class Side(asyncio.Protocol):
    """One TCP connection of a proxied pair: what it reads goes into `out`; when the peer's
    buffer is full, `peer_transport` stops reading (back pressure across the proxy)."""

    def __init__(self, out: Direction) -> None:
        self.out = out
        self.transport: asyncio.Transport | None = None
        self.peer: Side | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.out.push(data)

    def eof_received(self) -> bool:
        self.out.end()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.out.end()

    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()


class ClientSide(Side):
    """The accepted connection: opens the upstream one and wires both directions."""

    def __init__(self, target: tuple[str, int], delay_s: float) -> None:
        loop = asyncio.get_running_loop()
        super().__init__(Direction(loop, delay_s))
        self.target = target
        self.down = Direction(loop, delay_s)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        assert self.transport is not None
        self.down.attach(self.transport)
        asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        upstream = Side(self.down)
        try:
            transport, _ = await loop.create_connection(lambda: upstream, *self.target)
        except OSError:
            if self.transport is not None:
                self.transport.close()
            return
        upstream.peer, self.peer = self, upstream
        self.out.attach(transport)


async def serve(listen: list[tuple[str, int]], target: tuple[str, int], delay_s: float) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    servers = [
        await loop.create_server(lambda: ClientSide(target, delay_s), host, port)
        for host, port in listen
    ]
    print("ready", flush=True)
    await stop.wait()
    for server in servers:
        server.close()


PR_SET_TIMERSLACK = 29  # linux/prctl.h


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--one-way-ms", type=float, required=True, help="delay per direction")
    p.add_argument("--target", type=host_port, required=True, help="HOST:PORT to forward to")
    p.add_argument("--listen", type=host_port, action="append", required=True)
    p.add_argument("--realtime", action="store_true", help="SCHED_FIFO (needs root)")
    args = p.parse_args()
    if args.one_way_ms < 0:
        p.error("--one-way-ms cannot be negative")
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0)
    if args.realtime:
        # Low among real-time priorities; the kernel's RT throttling still leaves 5 % to others.
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
    loop = asyncio.SelectorEventLoop(selectors.SelectSelector())
    try:
        loop.run_until_complete(serve(args.listen, args.target, args.one_way_ms / 1000))
    finally:
        loop.close()
    sys.exit(0)


if __name__ == "__main__":
    main()
