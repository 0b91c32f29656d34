"""arq driver: Redis queue, 2 worker processes running ``arq.run_worker(WorkerSettings)`` with
``max_jobs = 8`` (jobs in flight per process, as hivejobs' concurrency; arq's default is 10),
an ``async def`` job. The workers are started through ``run_worker`` rather than the ``arq``
command only because that command logs every job at INFO and has no flag to lower it; here
logging is at WARNING as for the other peers. arq has no bulk enqueue, so only single
enqueues are timed; its other settings are its defaults (results kept for an hour)."""

from __future__ import annotations

import asyncio
import os
import sys
from importlib.metadata import version

import _common
from arq import create_pool
from arq.connections import RedisSettings

if __name__ == "__main__":
    ARGS = _common.parse_args()  # sets PEERS_REDIS_URL before the settings below are built

QUEUE = "bench"
WORKER_CODE = (
    "import logging, arq, arq_driver; logging.basicConfig(level=logging.WARNING); "
    "arq.run_worker(arq_driver.WorkerSettings)"
)


async def noop(ctx: dict, t: float) -> None:
    """The job: the asyncio body (sync: the blocking one in a thread), then the counter."""
    await _common.ajob(t)


class WorkerSettings:
    # no default URL on purpose: a missing one must fail, not fall back to Redis db 0
    redis_settings = RedisSettings.from_dsn(os.environ[_common.REDIS_URL_ENV])
    functions = [noop]
    queue_name = QUEUE
    max_jobs = 8


def main(args) -> None:
    body = _common.chosen_body(("async", "sync"))  # asyncio: its own body is async
    _common.install_sigterm()
    loop = asyncio.new_event_loop()
    pool = loop.run_until_complete(create_pool(WorkerSettings.redis_settings))

    def start_workers(w: _common.Workers) -> None:
        for _ in range(2):
            w.start([sys.executable, "-c", WORKER_CODE])

    try:
        result = _common.run_workload(
            args,
            system="arq",
            version=version("arq"),
            keeps_jobs_in="Redis only",
            enqueue_one=lambda t: loop.run_until_complete(
                pool.enqueue_job("noop", t, _queue_name=QUEUE)
            ),
            enqueue_bulk=None,
            start_workers=start_workers,
            settings=f"Redis, 2 x `run_worker`, max_jobs=8 per process, {_common.BODY_LABEL[body]}",
        )
    finally:
        loop.run_until_complete(pool.aclose())
        loop.close()
    _common.emit(result)


if __name__ == "__main__":
    main(ARGS)
