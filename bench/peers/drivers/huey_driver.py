"""huey driver: RedisHuey (blocking BRPOP dequeue, its default), 2 ``huey_consumer -k thread
-w 8`` processes (8 worker threads each, as hivejobs). huey has no bulk enqueue API."""

from __future__ import annotations

import os
import sys
from importlib.metadata import version
from pathlib import Path

import _common
from huey import RedisHuey

if __name__ == "__main__":
    ARGS = _common.parse_args()  # sets PEERS_REDIS_URL before the huey below is built

# no default URL on purpose: a missing one must fail, not fall back to Redis db 0
huey = RedisHuey("bench", url=os.environ[_common.REDIS_URL_ENV])


@huey.task()
def noop(t: float) -> None:
    """The job: the blocking body (_common.job), then the shared counter."""
    _common.job(t)


def main(args) -> None:
    _common.chosen_body(("sync",))  # a thread/process system: the blocking body
    _common.install_sigterm()
    # huey names tasks "<module>.<function>": enqueue through the module the workers import,
    # not through this file's "__main__" copy
    import huey_driver

    def start_workers(w: _common.Workers) -> None:
        exe = str(Path(sys.executable).parent / "huey_consumer")
        # 2 consumer processes x 8 worker threads, as hivejobs: a huey user whose jobs wait on
        # I/O runs thread workers. SIGTERM = immediate shutdown for huey (SIGINT is its
        # graceful one): fine for cleanup
        for _ in range(2):
            w.start([exe, "huey_driver.huey", "-k", "thread", "-w", "8", "-q"])

    result = _common.run_workload(
        args,
        system="huey",
        version=version("huey"),
        keeps_jobs_in="Redis only",
        enqueue_one=lambda t: huey_driver.noop(t),
        enqueue_bulk=None,
        start_workers=start_workers,
        settings="RedisHuey (blocking), 2 x `huey_consumer -k thread -w 8`",
    )
    _common.emit(result)


if __name__ == "__main__":
    main(ARGS)
