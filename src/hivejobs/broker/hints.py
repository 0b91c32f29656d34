"""The rule for a push of ids that Postgres already holds: Redis carries hints, so a push that
fails costs latency only. The jobs are committed and queued; the coordinator's reconciler
pushes every queued job no list holds (R1, docs/concepts/reliability.md). Such a failure is
logged, once, in the words below, and never raised to the caller, whose act has succeeded.

Imports no other module of broker/: any push site may use it (the Broker's own Pusher too).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import redis
from loguru import logger

from hivejobs.logs import error_fields

NOT_PUSHED = "{what} stored but not pushed; the reconciler will push them"


@contextmanager
def left_to_reconciler(what: str, **fields: object) -> Iterator[None]:
    """Around a push (sync or awaited) of committed jobs: a RedisError is logged as
    NOT_PUSHED with `fields` (jobs=, job_type=, chain_id=) and goes no further.

    `what` names the jobs in our own words ("requeued jobs"); the caller's frame is the one
    the log line names."""
    try:
        yield
    except redis.RedisError as exc:
        # depth 2: past this generator and contextlib's __exit__, to the `with` line.
        logger.opt(depth=2).warning(NOT_PUSHED, what=what, **fields, **error_fields(exc))
