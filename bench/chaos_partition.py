"""Chaos scenario S15 (RELIABILITY.md): latency and a partition between one instance and
Postgres, through an asyncio TCP proxy on 127.0.0.1 that runs in the chaos process.

`tc netem` in a network namespace was not used: the instances are ordinary processes on the
shared loopback, and a proxy in front of instance A hurts A alone.
"""

from __future__ import annotations

import asyncio
import tempfile
import threading
import time
from pathlib import Path

from bench.chaoslib import Row, Scenario, leader, pause, scaled
from bench.harness import (
    RedisServer,
    free_port,
    pool_pids,
    read_ledger,
    running_in_pid,
    sql,
    wait_until,
)

# -- S15 -------------------------------------------------------------------------------


class Proxy:
    """An asyncio TCP proxy on 127.0.0.1 in a thread of its own: pass, delay each chunk by
    `delay_s` per direction, or blackhole (stop forwarding and reading: bytes wait in the
    kernel buffers as in a partition without resets, and flow again on heal).

    A delayed chunk leaves at its arrival time plus `delay_s`, whatever is queued before it:
    a link's latency, not one delay per chunk in a row (a burst of k chunks would otherwise
    take k delays). Owns `delay_s` and `open` (set while the link passes); both change only
    on the loop's thread, in set(), which returns once the change is in force."""

    QUEUED_CHUNKS = 64  # per direction: beyond this the reader waits (back pressure)

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.delay_s = 0.0
        self.open = asyncio.Event()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)

    async def _start(self) -> asyncio.Server:
        self.open.set()
        return await asyncio.start_server(self._serve, "127.0.0.1", self.port)

    def set(self, delay_s: float = 0.0, blackhole: bool = False) -> None:
        """Change the link; in force when this returns (the caller times the fault from it)."""

        async def apply() -> None:
            self.delay_s = delay_s
            if blackhole:
                self.open.clear()
            else:
                self.open.set()

        asyncio.run_coroutine_threadsafe(apply(), self.loop).result(10)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self.open.wait()
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(self._pump(reader, up_w), self._pump(up_r, writer))

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        """One direction: a reader stamps each chunk with the time it is due, a writer sends
        it then (and only while the link is open); None marks the end of the source. The
        queue is bounded: a reader ahead of its writer by QUEUED_CHUNKS waits."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue(self.QUEUED_CHUNKS)

        async def read() -> None:
            try:
                while True:
                    await self.open.wait()
                    data = await src.read(65536)
                    if not data:
                        break
                    await queue.put((loop.time() + self.delay_s, data))
            except (ConnectionError, OSError):
                pass
            await queue.put(None)  # not when cancelled (close()): the writer is cancelled too

        async def write() -> None:
            broken = False
            try:
                while (chunk := await queue.get()) is not None:
                    if broken:
                        continue  # the destination is gone: drain, so the reader never waits
                    due, data = chunk
                    if due > loop.time():
                        await asyncio.sleep(due - loop.time())  # the link's latency itself
                    await self.open.wait()
                    try:
                        dst.write(data)
                        await dst.drain()
                    except (ConnectionError, OSError):
                        broken = True
                        dst.close()  # the other direction then sees the end of its source
            finally:
                dst.close()

        await asyncio.gather(read(), write())

    def close(self) -> None:
        """Stop listening, end every proxied connection, then the loop and its thread."""

        async def shutdown() -> None:
            self.server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(shutdown(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


def partition(scale: float) -> Row:
    """S15: instance A reaches Postgres and Redis through the proxy, B directly. (a) 50 ms
    per round trip for a while; (b) A cut from Postgres for 2 x stuck_after while it runs long
    jobs and holds the lease; (c) heal. B takes the lease and rescues A's claims; A's late
    completions are fenced; A claims nothing while it cannot heartbeat."""
    server = RedisServer(Path(tempfile.mkdtemp(prefix="hjchaos-redis-")))
    s = Scenario("S15 partition + latency", server.url)
    pg_proxy = Proxy(5432)
    redis_proxy = Proxy(server.port)
    try:
        via = {
            "HIVEJOBS_DATABASE_URL": s.url.replace(":5432/", f":{pg_proxy.port}/"),
            "HIVEJOBS_REDIS_URL": f"redis://127.0.0.1:{redis_proxy.port}/0",
        }
        a = s.instance("alo,amo", **via)
        wait_until(lambda: leader(s.url)[0], timeout=60, what="A leads")
        a_leader = leader(s.url)[0]
        app = s.app(["alo", "amo"])
        a_pids = set(pool_pids(s.url, "alo") + pool_pids(s.url, "amo"))
        n = scaled(5000, scale, 500)
        # (a) latency: correctness unchanged, throughput down. It stays on until every job
        # of this phase has finished (a fixed pause could end first), so all ran through it.
        pg_proxy.set(delay_s=0.025)
        redis_proxy.set(delay_s=0.025)
        alo = app.enqueue_many("alo", [{"ms": 5}] * (n // 2))
        s.wait_done(len(alo), timeout=180)
        pg_proxy.set()
        redis_proxy.set()
        # (b) long jobs on A, then A cut from Postgres; B starts and should take over.
        long_alo = app.enqueue_many("alo", [{"ms": 15_000}] * 8)
        long_amo = app.enqueue_many("amo", [{"ms": 15_000}] * 4)
        wait_until(
            lambda: sum(len(running_in_pid(s.ledger, p)) for p in a_pids) >= 12,
            timeout=120,
            what="A runs the long jobs",
        )
        a_workers = [
            r[0]
            for r in sql(
                s.url, "SELECT id FROM hivejobs_worker WHERE pid = ANY(%s)", (list(a_pids),)
            )
        ]
        b = s.instance("alo,amo")
        wait_until(lambda: len(pool_pids(s.url, "alo")) == 2, timeout=60, what="B up")
        stuck = float(app.settings.stuck_after_s)
        pg_proxy.set(blackhole=True)
        cut = time.monotonic()
        cut_ns = time.monotonic_ns()
        s.recovery(cut, lambda: leader(s.url)[0] not in (0, a_leader), "B leads", timeout=30)
        alo += app.enqueue_many("alo", [{"ms": 5}] * (n // 2))
        # The plan cuts for 2 x stuck_after; B's rescue also waits for its own health window
        # (R6) after it took the lease, so the cut lasts until B has rescued A's claims.
        rescue_s = s.recovery(
            cut,
            lambda: (
                not sql(
                    s.url,
                    "SELECT 1 FROM hivejobs_job WHERE worker_id = ANY(%s::uuid[])",
                    (a_workers,),
                )
            ),
            "B rescued A's claims",
            timeout=60,
        )
        pause(max(0.0, 2 * stuck - (time.monotonic() - cut)))
        pg_proxy.set()  # (c) heal
        healed_ns = time.monotonic_ns()
        # A's handlers ran on as zombies after the rescue: their ledger ends are not recorded
        # completions (fenced, I7), so A's pids count as killed for the ledger check.
        s.killed |= a_pids
        row = s.result(alo=alo + long_alo, amo=long_amo, timeout=240)
        starts_in_a = [
            p
            for p in read_ledger(s.ledger)
            if p[0] == "start"
            and int(p[3]) in a_pids
            and cut_ns + int(stuck / 2 * 1e9) + 10**9 < int(p[4]) < healed_ns
        ]
        s.check(not starts_in_a, f"A started {len(starts_in_a)} jobs while cut off")
        final = s.archived()
        s.check(
            all(final[i][2] == "worker lost" for i in long_amo if final[i][0] == "failed"),
            "an amo job failed otherwise than 'worker lost'",
        )
        fenced = a.log_text().count("claim lost")
        s.check(b.proc.poll() is None and a.proc.poll() is None, "a supervisor exited")
        notes = f"rescue {rescue_s:.1f} s after the cut; A logged {fenced} 'claim lost'"
        return s.rejudge(row, notes=notes)
    finally:
        s.close()
        pg_proxy.close()
        redis_proxy.close()
        server.stop()
