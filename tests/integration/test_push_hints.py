"""broker.hints.left_to_reconciler: a push of committed jobs that Redis refuses is logged once,
naming the caller, and goes no further; other errors are not its business."""

from __future__ import annotations

import socket

import pytest
import redis
from loguru import logger

from hivejobs.broker.hints import left_to_reconciler


def _closed_port() -> int:
    """A local port nothing listens on: a real connection refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_refused_push_is_logged_for_the_reconciler_and_not_raised() -> None:
    client = redis.Redis(port=_closed_port(), socket_connect_timeout=5)
    records: list[dict[str, object]] = []
    sink = logger.add(lambda m: records.append(dict(m.record)), level="WARNING")
    try:
        with left_to_reconciler("requeued jobs", jobs=2, job_type="thing"):
            client.rpush("hivejobs-test:never", "a", "b")
    finally:
        logger.remove(sink)
        client.close()
    assert len(records) == 1
    record = records[0]
    assert record["message"] == (
        "requeued jobs stored but not pushed; the reconciler will push them"
    )
    extra = record["extra"]
    assert isinstance(extra, dict)
    assert extra["jobs"] == 2 and extra["job_type"] == "thing"
    assert extra["error_type"] == "ConnectionError"
    # The line names the push site, not the helper.
    assert record["function"] == "test_a_refused_push_is_logged_for_the_reconciler_and_not_raised"


def test_an_error_that_is_not_redis_goes_through() -> None:
    with pytest.raises(ValueError), left_to_reconciler("dispatched jobs", jobs=1):
        raise ValueError("a bug, not a lost hint")
