"""Fixtures of the enqueue tests: an App with two job types, and a dispatch listener."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import psycopg
import pytest

from hivejobs import App, JobContext


class Resize(msgspec.Struct):
    width: int
    height: int


@pytest.fixture
def app(make_app: Callable[..., App]) -> App:
    app = make_app()

    @app.job("resize")
    def resize(ctx: JobContext, payload: Resize) -> None: ...

    @app.job("notify")
    def notify(ctx: JobContext, payload: dict[str, Any]) -> None: ...

    return app


@pytest.fixture
def listener(database_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("LISTEN hivejobs_dispatch")
        yield conn
