"""pytest plugin (entry point `pytest11`): each test gets its own migrated database and Redis
key prefix, both dropped afterwards, so tests of an app never see each other's jobs.

Fixture names start with `hivejobs_` so they never clash with a project's own. The servers:
HIVEJOBS_TEST_DATABASE_URL (else HIVEJOBS_DATABASE_URL, else the local default) names a
Postgres whose role may create databases; HIVEJOBS_TEST_REDIS_URL (else HIVEJOBS_REDIS_URL)
a Redis. Only databases and keys this plugin created are dropped.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
import redis

from hivejobs.client.app import App
from hivejobs.config import DEFAULT_DATABASE_URL, DEFAULT_REDIS_URL, BackendSource
from hivejobs.urls import remember_secrets

_RUN = uuid.uuid4().hex[:8]


def _server_url(kind: str, default: str) -> str:
    return (
        os.environ.get(f"HIVEJOBS_TEST_{kind}_URL")
        or os.environ.get(f"HIVEJOBS_{kind}_URL")
        or default
    )


def _with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + name))


def _create(url: str, name: str, template: str | None = None) -> None:
    # The server's maintenance database: CREATE DATABASE cannot run in the one being copied.
    with psycopg.connect(_with_database(url, "postgres"), autocommit=True) as conn:
        suffix = f' TEMPLATE "{template}"' if template else ""
        conn.execute(f'CREATE DATABASE "{name}"{suffix}')


def _drop(url: str, name: str) -> None:
    with psycopg.connect(_with_database(url, "postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def hivejobs_template_database() -> Iterator[str]:
    """A database migrated once per session; each test gets a copy (CREATE ... TEMPLATE is
    far faster than migrating every time)."""
    server = _server_url("DATABASE", DEFAULT_DATABASE_URL)
    name = f"hivejobs_test_tmpl_{_RUN}"
    _create(server, name)
    url = _with_database(server, name)
    app = App(database_url=url, redis_url=_server_url("REDIS", DEFAULT_REDIS_URL))
    try:
        app.migrate()
    finally:
        app.close()
    yield url
    _drop(server, name)


@pytest.fixture
def hivejobs_database_url(hivejobs_template_database: str) -> Iterator[str]:
    """A migrated database of this test's own, dropped after it."""
    name = f"hivejobs_test_{_RUN}_{uuid.uuid4().hex[:8]}"
    template = urlsplit(hivejobs_template_database).path.lstrip("/")
    _create(hivejobs_template_database, name, template)
    yield _with_database(hivejobs_template_database, name)
    _drop(hivejobs_template_database, name)


@pytest.fixture
def hivejobs_redis_url() -> str:
    return _server_url("REDIS", DEFAULT_REDIS_URL)


@pytest.fixture
def hivejobs_redis_prefix(hivejobs_redis_url: str) -> Iterator[str]:
    """A Redis key prefix of this test's own; its keys are deleted after it."""
    prefix = f"hivejobs-test:{_RUN}:{uuid.uuid4().hex[:8]}:"
    yield prefix
    client = redis.Redis.from_url(hivejobs_redis_url)
    try:
        keys = list(client.scan_iter(match=prefix + "*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


@pytest.fixture
def hivejobs_isolate(
    hivejobs_database_url: str, hivejobs_redis_url: str, hivejobs_redis_prefix: str
) -> Iterator[Callable[[App], App]]:
    """Point an app (your module's `app`) at this test's database and prefix; after the test
    its connections are closed and its own settings come back."""
    saved: list[tuple[App, str, str, str, BackendSource]] = []

    def isolate(app: App) -> App:
        s = app.settings
        app.close()
        saved.append((app, s.database_url, s.redis_url, s.prefix, s.backend_source))
        s.database_url = hivejobs_database_url
        s.redis_url = hivejobs_redis_url
        s.prefix = hivejobs_redis_prefix
        s.backend_source = "explicit"
        remember_secrets(hivejobs_database_url, hivejobs_redis_url)
        return app

    yield isolate
    for app, database_url, redis_url, prefix, source in reversed(saved):
        app.close()
        app.settings.database_url = database_url
        app.settings.redis_url = redis_url
        app.settings.prefix = prefix
        app.settings.backend_source = source


@pytest.fixture
def hivejobs_app(
    hivejobs_database_url: str, hivejobs_redis_url: str, hivejobs_redis_prefix: str
) -> Iterator[App]:
    """A fresh App on this test's database and prefix, for tests that register their own
    types; closed after the test."""
    app = App(
        database_url=hivejobs_database_url,
        redis_url=hivejobs_redis_url,
        prefix=hivejobs_redis_prefix,
    )
    yield app
    app.close()
