"""The rule for a push of ids that Postgres already holds: Redis carries hints, so a push that
fails costs latency only. The jobs are committed and queued; the coordinator's reconciler
pushes every queued job no list holds (R1, docs/concepts/reliability.md). Such a failure is
logged, once, in the words below, and never raised to the caller, whose act has succeeded.

Imports no other module of broker/: any push site may use it (the Broker's own Pusher too).
"""

from __future__ import annotations

from types import TracebackType

import redis
from loguru import logger

from hivejobs.logs import error_fields

NOT_PUSHED = "{what} stored but not pushed; the reconciler will push them"


class left_to_reconciler:  # noqa: N801 - used as a `with` phrase, like contextlib's
    """Around a push (sync or awaited) of committed jobs: a RedisError is logged as
    NOT_PUSHED with `fields` (jobs=, job_type=, chain_id=) and goes no further.

    `what` names the jobs in our own words ("requeued jobs"); the log line names the frame
    of the `with`. A class, not a generator: it wraps every enqueue's push, where
    contextlib's machinery cost microseconds a job."""

    __slots__ = ("_what", "_fields")

    def __init__(self, what: str, **fields: object) -> None:
        self._what = what
        self._fields = fields

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        if not isinstance(exc, redis.RedisError):
            return False
        logger.opt(depth=1).warning(
            NOT_PUSHED, what=self._what, **self._fields, **error_fields(exc)
        )
        return True
