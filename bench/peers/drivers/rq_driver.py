"""RQ driver: 2 ``rq worker`` processes with SimpleWorker (runs jobs in-process, RQ's fast
mode). ``--variant fork`` uses RQ's default forking ``Worker`` (one fork per job) instead."""

from __future__ import annotations

import sys
from importlib.metadata import version
from pathlib import Path

import _common
from redis import Redis
from rq import Queue

QUEUE = "bench"


def noop(t: float) -> None:
    """The job: the blocking body (_common.job), then the shared counter."""
    _common.job(t)


def main() -> None:
    args = _common.parse_args()
    _common.chosen_body(("sync",))  # a thread/process system: the blocking body
    _common.install_sigterm()
    worker_class = "rq.Worker" if args.variant == "fork" else "rq.SimpleWorker"
    q = Queue(QUEUE, connection=Redis.from_url(args.redis_url))
    func = "rq_driver.noop"  # by import path: this file runs as __main__

    def enqueue_bulk(ts: list[float]) -> None:
        q.enqueue_many([Queue.prepare_data(func, (t,)) for t in ts])

    def start_workers(w: _common.Workers) -> None:
        rq_bin = str(Path(sys.executable).parent / "rq")
        for i in range(2):
            w.start(
                [
                    rq_bin,
                    "worker",
                    "-w",
                    worker_class,
                    "-u",
                    args.redis_url,
                    "-n",
                    f"bench-{i}",
                    "--logging_level",
                    "WARNING",
                    QUEUE,
                ]
            )

    result = _common.run_workload(
        args,
        system="rq-fork" if args.variant == "fork" else "rq",
        version=version("rq"),
        keeps_jobs_in="Redis only",
        enqueue_one=lambda t: q.enqueue(func, t),
        enqueue_bulk=enqueue_bulk,
        start_workers=start_workers,
        settings=f"2 x `rq worker -w {worker_class}` (one job at a time each: RQ has no threads)"
        ", enqueue_many for bulk",
    )
    _common.emit(result)


if __name__ == "__main__":
    main()
