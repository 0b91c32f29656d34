"""huey driver: RedisHuey (blocking BRPOP dequeue, its default), one ``huey_consumer -k process
-w 2`` (2 worker processes plus the consumer's scheduler). huey has no bulk enqueue API."""

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
    """The job: the chosen body (_common.job), then the shared counter."""
    _common.job(t)


def main(args) -> None:
    _common.install_sigterm()
    # huey names tasks "<module>.<function>": enqueue through the module the workers import,
    # not through this file's "__main__" copy
    import huey_driver

    def start_workers(w: _common.Workers) -> None:
        exe = str(Path(sys.executable).parent / "huey_consumer")
        # SIGTERM = immediate shutdown for huey (SIGINT is its graceful one): fine for cleanup
        w.start([exe, "huey_driver.huey", "-k", "process", "-w", "2", "-q"])

    result = _common.run_workload(
        args,
        system="huey",
        version=version("huey"),
        keeps_jobs_in="Redis only",
        enqueue_one=lambda t: huey_driver.noop(t),
        enqueue_bulk=None,
        start_workers=start_workers,
        settings="RedisHuey (blocking), `huey_consumer -k process -w 2`",
    )
    _common.emit(result)


if __name__ == "__main__":
    main(ARGS)
