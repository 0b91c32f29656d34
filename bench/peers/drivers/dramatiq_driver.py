"""Dramatiq driver: RedisBroker, ``dramatiq dramatiq_driver -p 2 -t 8`` (2 processes x 8
threads), default middleware. Dramatiq has no bulk enqueue API."""

from __future__ import annotations

import os
import sys
from importlib.metadata import version
from pathlib import Path

import _common
import dramatiq
from dramatiq.brokers.redis import RedisBroker

if __name__ == "__main__":
    ARGS = _common.parse_args()  # sets PEERS_REDIS_URL before the broker below is built

# the broker is configured at import time, in the driver and in every worker process alike;
# no default URL on purpose: a missing one must fail, not fall back to Redis db 0
dramatiq.set_broker(RedisBroker(url=os.environ[_common.REDIS_URL_ENV]))


@dramatiq.actor(actor_name="noop", queue_name="bench")
def noop(t: float) -> None:
    """The job: the blocking body (_common.job), then the shared counter."""
    _common.job(t)


def main(args) -> None:
    _common.chosen_body(("sync",))  # a thread/process system: the blocking body
    _common.install_sigterm()

    def start_workers(w: _common.Workers) -> None:
        exe = str(Path(sys.executable).parent / "dramatiq")
        w.start(
            [exe, "dramatiq_driver", "-p", "2", "-t", "8", "-Q", "bench"],
            env={_common.REDIS_URL_ENV: args.redis_url},
        )

    result = _common.run_workload(
        args,
        system="dramatiq",
        version=version("dramatiq"),
        keeps_jobs_in="Redis only",
        enqueue_one=lambda t: noop.send(t),
        enqueue_bulk=None,
        start_workers=start_workers,
        settings="RedisBroker, `dramatiq -p 2 -t 8`, default middleware",
    )
    _common.emit(result)


if __name__ == "__main__":
    main(ARGS)
