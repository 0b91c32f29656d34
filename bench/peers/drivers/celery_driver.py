"""Celery driver: Redis broker, 2 ``celery worker --pool threads -c 8`` processes (8 threads
each, as hivejobs), no result backend. Celery has no bulk enqueue API (a ``group`` still
publishes one message per task), so only single enqueues are timed."""

from __future__ import annotations

import os
import sys
from importlib.metadata import version
from pathlib import Path

import _common
from celery import Celery

if __name__ == "__main__":
    ARGS = _common.parse_args()  # sets PEERS_REDIS_URL before the app below is built

# no default URL on purpose: a missing one must fail, not fall back to Redis db 0
app = Celery("bench", broker=os.environ[_common.REDIS_URL_ENV])
app.conf.update(
    task_ignore_result=True,
    task_default_queue="bench",
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=True,
)


@app.task(name="noop")
def noop(t: float) -> None:
    """The job: the blocking body (_common.job), then the shared counter."""
    _common.job(t)


def main(args) -> None:
    _common.chosen_body(("sync",))  # a thread/process system: the blocking body
    _common.install_sigterm()

    def start_workers(w: _common.Workers) -> None:
        # 2 worker processes x 8 threads, as hivejobs and dramatiq: a Celery user whose jobs
        # wait on I/O runs a thread pool (the prefork default runs one job per child process)
        exe = str(Path(sys.executable).parent / "celery")
        for i in range(2):
            w.start(
                [
                    exe,
                    "-A",
                    "celery_driver",
                    "worker",
                    "--pool",
                    "threads",
                    "-c",
                    "8",
                    "-n",
                    f"bench{i}@%h",
                    "-Q",
                    "bench",
                    "-l",
                    "WARNING",
                    "--without-gossip",
                    "--without-mingle",
                    "--without-heartbeat",
                ],
                env={_common.REDIS_URL_ENV: args.redis_url},
            )

    result = _common.run_workload(
        args,
        system="celery",
        version=version("celery"),
        keeps_jobs_in="Redis only",
        enqueue_one=lambda t: noop.delay(t),
        enqueue_bulk=None,
        start_workers=start_workers,
        settings="Redis broker, 2 x `celery worker --pool threads -c 8`, default prefetch (4)",
    )
    _common.emit(result)


if __name__ == "__main__":
    main(ARGS)
