"""saq driver: Redis queue, ``saq saq_driver.settings --workers 2`` (2 processes), asyncio
job with concurrency 8 per process. saq has no fire-and-forget bulk enqueue (``map`` waits
for the results), so only single enqueues are timed."""

from __future__ import annotations

import asyncio
import os
import sys
from importlib.metadata import version
from pathlib import Path

import _common
from saq import Queue

if __name__ == "__main__":
    ARGS = _common.parse_args()  # sets PEERS_REDIS_URL before the queue below is built

# no default URL on purpose: a missing one must fail, not fall back to Redis db 0
queue = Queue.from_url(os.environ[_common.REDIS_URL_ENV], name="bench")


async def noop(ctx: dict, *, t: float) -> None:
    """The job: the asyncio body (sync: the blocking one in a thread), then the counter."""
    await _common.ajob(t)


settings = {"queue": queue, "functions": [noop], "concurrency": 8}


def main(args) -> None:
    body = _common.chosen_body(("async", "sync"))  # asyncio: its own body is async
    _common.install_sigterm()
    loop = asyncio.new_event_loop()
    loop.run_until_complete(queue.connect())

    def start_workers(w: _common.Workers) -> None:
        exe = str(Path(sys.executable).parent / "saq")
        w.start([exe, "saq_driver.settings", "--workers", "2"])

    try:
        result = _common.run_workload(
            args,
            system="saq",
            version=version("saq"),
            keeps_jobs_in="Redis only",
            enqueue_one=lambda t: loop.run_until_complete(queue.enqueue("noop", t=t)),
            enqueue_bulk=None,
            start_workers=start_workers,
            settings="Redis, `saq --workers 2`, concurrency 8 per process, "
            f"{_common.BODY_LABEL[body]}",
        )
    finally:
        loop.run_until_complete(queue.disconnect())
        loop.close()
    _common.emit(result)


if __name__ == "__main__":
    main(ARGS)
