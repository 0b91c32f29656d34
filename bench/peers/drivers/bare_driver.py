"""bare driver: NOT a job queue, the floor under every row: the same job body behind the
thinnest queue there is, so the table shows the ceiling any queue can reach on this machine
with this body (the body, the harness's counter and a near-free hand-off).

A job is its enqueue time as text in the Redis list ``bare:queue``: ``RPUSH`` one, or one
variadic ``RPUSH`` per bulk chunk (one command, one round trip, no transaction). Nothing is
stored, acknowledged or retried: a worker that dies loses what it popped.

Workers: 2 OS processes (this file with ``--worker``), each with 8 consumers (8 threads for
the blocking body, 8 asyncio tasks on one loop, uvloop's where installed, for the asyncio
body) that share a local buffer: a consumer that finds it empty refills it under a lock with
``LPOP bare:queue 64`` (one round trip per up to 64 jobs), or when the list is empty waits
with ``BLPOP bare:queue 1`` (which is what picks up the pickup-latency phase's jobs). The
refill is done by one consumer while the others finish their jobs and then wait on the lock.
The workers keep the default SIGTERM action (immediate exit): they hold nothing to hand back.
"""

from __future__ import annotations

import asyncio
import collections
import importlib.util
import os
import sys
import threading

import _common
import redis
import redis.asyncio

QUEUE = "bare:queue"
BATCH = 64  # items per LPOP
IN_FLIGHT = 8  # consumers per process (threads or asyncio tasks)
PROCESSES = 2
WAIT_S = 1  # BLPOP timeout when the list is empty


def _client() -> redis.Redis:
    return redis.Redis.from_url(os.environ[_common.REDIS_URL_ENV])


def _take(client: redis.Redis) -> list[bytes]:
    """Up to BATCH items, or, when the list is empty, the next one within WAIT_S (or none)."""
    items = client.lpop(QUEUE, BATCH)
    if items:
        return items
    got = client.blpop([QUEUE], timeout=WAIT_S)
    return [got[1]] if got else []


def run_sync() -> None:
    """8 threads running the blocking body, fed from one buffer refilled under a lock."""
    client = _client()
    lock = threading.Lock()
    items: collections.deque[bytes] = collections.deque()

    def consume() -> None:
        while True:
            try:
                item = items.popleft()
            except IndexError:
                with lock:
                    if not items:
                        items.extend(_take(client))
                continue
            _common.job(float(item))

    threads = [threading.Thread(target=consume, daemon=True) for _ in range(IN_FLIGHT)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


async def _atake(client: redis.asyncio.Redis) -> list[bytes]:
    items = await client.lpop(QUEUE, BATCH)
    if items:
        return items
    got = await client.blpop([QUEUE], timeout=WAIT_S)
    return [got[1]] if got else []


async def run_async() -> None:
    """8 tasks running the asyncio body on this loop, fed from one buffer refilled under an
    asyncio lock."""
    client = redis.asyncio.Redis.from_url(os.environ[_common.REDIS_URL_ENV])
    lock = asyncio.Lock()
    items: collections.deque[bytes] = collections.deque()

    async def consume() -> None:
        while True:
            try:
                item = items.popleft()
            except IndexError:
                async with lock:
                    if not items:
                        items.extend(await _atake(client))
                continue
            await _common.ajob(float(item))

    await asyncio.gather(*(consume() for _ in range(IN_FLIGHT)))


def has_uvloop() -> bool:
    return importlib.util.find_spec("uvloop") is not None


def worker() -> None:
    if os.environ[_common.BODY_ENV] == "sync":
        run_sync()
        return
    if has_uvloop():
        import uvloop

        loop = uvloop.new_event_loop()
    else:
        loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    loop.run_until_complete(run_async())


def main() -> None:
    args = _common.parse_args()
    body = _common.chosen_body(("sync", "async"))
    _common.install_sigterm()
    client = _client()

    def start_workers(w: _common.Workers) -> None:
        for _ in range(PROCESSES):
            w.start([sys.executable, os.path.abspath(__file__), "--worker"])

    if body == "async":
        loop = "uvloop" if has_uvloop() else "asyncio's own loop (uvloop not installed)"
        how = f"{IN_FLIGHT} asyncio tasks on {loop}, {_common.BODY_LABEL[body]}"
    else:
        how = f"{IN_FLIGHT} threads, blocking body"
    try:
        result = _common.run_workload(
            args,
            system="bare",
            version="-",
            keeps_jobs_in="nowhere (a Redis list; no storage, acks or retries)",
            enqueue_one=lambda t: client.rpush(QUEUE, repr(t)),
            enqueue_bulk=lambda ts: client.rpush(QUEUE, *map(repr, ts)),
            start_workers=start_workers,
            settings=f"not a job queue: a Redis list popped {BATCH} at a time, "
            f"{PROCESSES} processes x {IN_FLIGHT} in flight ({how}), the same body: "
            "the ceiling on this machine",
        )
    finally:
        client.close()
    _common.emit(result)


if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        worker()
    else:
        main()
