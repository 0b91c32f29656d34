"""`run_at` has the bounds of `delay`: at most 366 days ahead, at most one day behind now.
A year-1 run_at showed as centuries of pickup latency until Redis was flushed, a year-9999
one waited forever while `delay` refused a day over a year. Refused before anything is
stored, in the Python API and the CLI (the HTTP API is in tests/web/test_hardening.py)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

from hivejobs import App, InvalidArgument
from tests.harness import sql
from tests.process.cli import cli_env, hivejobs

FAR = [
    datetime(1, 1, 1, tzinfo=UTC),
    datetime(2000, 1, 1, tzinfo=UTC),
    datetime(9999, 12, 31, tzinfo=UTC),
]


def stored(url: str) -> int:
    return int(sql(url, "SELECT count(*) FROM hivejobs_job")[0][0])


@pytest.mark.parametrize("run_at", FAR, ids=lambda d: str(d.year))
def test_python_api_refuses_run_at_out_of_bounds(
    make_app: Callable[..., App], database_url: str, run_at: datetime
) -> None:
    app = make_app()
    app.job("echo")(lambda ctx, payload: payload)
    with pytest.raises(InvalidArgument, match="run_at must be between"):
        app.enqueue("echo", {}, run_at=run_at)
    assert stored(database_url) == 0


def test_python_api_accepts_run_at_within_bounds(
    make_app: Callable[..., App], database_url: str
) -> None:
    app = make_app()
    app.job("echo")(lambda ctx, payload: payload)
    now = datetime.now(UTC)
    for run_at in (now - timedelta(hours=23), now + timedelta(days=365)):
        app.enqueue("echo", {}, run_at=run_at)
    assert stored(database_url) == 2


def test_cli_refuses_run_at_out_of_bounds(database_url: str, redis_prefix: str) -> None:
    env = cli_env(
        HIVEJOBS_DATABASE_URL=database_url,
        HIVEJOBS_REDIS_URL="redis://127.0.0.1:6379/0",
        HIVEJOBS_PREFIX=redis_prefix,
        HIVEJOBS_APP="tests.apps.inputapp:app",
    )
    for run_at in ("9999-12-31", "0001-01-01T00:00:00+00:00", "400d"):
        done = hivejobs(["enqueue", "untyped", "{}", "--run-at", run_at], env)
        assert done.returncode == 2, done.stderr
        assert "Traceback" not in done.stderr
        assert "run_at must be between" in done.stderr, done.stderr
    assert stored(database_url) == 0
