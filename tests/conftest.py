"""Per run: a migrated template database. Per test: a clone of it and a Redis key prefix.

Everything created is dropped afterwards, so runs never see each other's data.

Under pytest-xdist (`scripts/test` runs `-n 2 --dist loadgroup`) each worker is a process of
its own with its own RUN_ID, template database and prefixes; the tests that must not share
the machine with one another (see HEAVY) are grouped onto one worker and run first.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
import redis

from hivejobs import App
from tests.harness import (
    FAST_SETTINGS,
    REDIS_URL,
    ROOT,
    Instance,
    RedisServer,
    db_url,
    pg_admin_url,
)

RUN_ID = uuid.uuid4().hex[:8]

# Tests that assert time bounds (a failover within N s, a pickup p50) or that load both cores
# (the chaos scenarios, the embedded servers' initdb): under xdist they form one group, so
# they run one after another on one worker, never two at once, while the other worker runs
# the light tests beside them. A new fault test joins by `pytest.mark.faults`.
HEAVY = (
    "tests/process/test_embedded.py",
    "tests/process/test_dev_security.py",
    "tests/process/test_pgbouncer.py",
    "tests/process/test_redis_topologies.py",
)
# The tests that run `hivejobs bench` judge nothing by time, but each starts a worker of two
# processes x 8 threads that keeps a core busy: they form a group of their own, one at a
# time, beside the heavy group (on the light worker's side).
BENCH = (
    "tests/process/test_bench.py",
    "tests/process/test_bench_debounce.py",
    "tests/process/test_bench_embedded.py",
    "tests/process/test_bench_progress.py",
    "tests/process/test_cli_secrets.py::test_no_redis_password_in_any_output",
)


def _group(item: pytest.Item) -> str | None:
    if item.nodeid.startswith(HEAVY) or item.get_closest_marker("faults") is not None:
        return "heavy"
    return "bench" if item.nodeid.startswith(BENCH) else None


def _order(item: pytest.Item) -> int:
    """The heavy group first, then the bench group and real-process tests, then the rest: the
    longest work starts early, so the run does not end with one worker busy and the other
    idle."""
    group = _group(item)
    if group == "heavy":
        return 0
    if group == "bench":
        return 1
    return 2 if item.path.relative_to(ROOT).parts[1] in ("process", "web") else 3


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if group := _group(item):
            item.add_marker(pytest.mark.xdist_group(group))
    if hasattr(config, "workerinput"):  # an xdist worker; every worker sorts alike
        items.sort(key=_order)  # stable: collection order within each rank


@pytest.fixture(scope="session")
def admin_url() -> str:
    return pg_admin_url()


@pytest.fixture(scope="session")
def template_db(admin_url: str) -> Iterator[str]:
    name = f"hjtest_tmpl_{RUN_ID}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    app = App(database_url=db_url(admin_url, name), redis_url=REDIS_URL)
    app.migrate()
    app.close()
    yield name
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def database_url(admin_url: str, template_db: str) -> Iterator[str]:
    name = f"hjtest_{RUN_ID}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
    yield db_url(admin_url, name)
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def redis_prefix() -> Iterator[str]:
    prefix = f"hjtest:{RUN_ID}:{uuid.uuid4().hex[:8]}:"
    yield prefix
    client = redis.Redis.from_url(REDIS_URL)
    keys = list(client.scan_iter(match=prefix.replace("{", "\\{") + "*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


@pytest.fixture
def make_app(database_url: str, redis_prefix: str) -> Iterator[Callable[..., App]]:
    apps: list[App] = []

    def factory(redis_url: str = REDIS_URL, **overrides: float) -> App:
        settings = {**FAST_SETTINGS, **overrides}
        app = App(
            database_url=database_url,
            redis_url=redis_url,
            prefix=redis_prefix,
            testing=None,
            **settings,
        )
        apps.append(app)
        return app

    yield factory
    for app in apps:
        app.close()


@pytest.fixture
def ledger_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "ledger"
    folder.mkdir()
    return folder


@pytest.fixture
def instance_env(database_url: str, redis_prefix: str, ledger_dir: Path) -> dict[str, str]:
    """Environment for `hivejobs run tests.apps.faultapp:app` with the fast test settings."""
    env = dict(os.environ)
    env.update(
        {
            "HIVEJOBS_DATABASE_URL": database_url,
            "HIVEJOBS_REDIS_URL": REDIS_URL,
            "HIVEJOBS_PREFIX": redis_prefix,
            "HJ_LEDGER": str(ledger_dir),
            "HIVEJOBS_TESTING": "1",
            "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
        }
    )
    env.update({"HIVEJOBS_" + k.upper(): str(v) for k, v in FAST_SETTINGS.items()})
    return env


@pytest.fixture
def start_instance(
    instance_env: dict[str, str], tmp_path: Path
) -> Iterator[Callable[..., Instance]]:
    started: list[Instance] = []

    def start(
        extra_env: dict[str, str] | None = None,
        args: list[str] | None = None,
        app_spec: str = "tests.apps.faultapp:app",
    ) -> Instance:
        env = {**instance_env, **(extra_env or {})}
        inst = Instance(env, tmp_path / f"instance{len(started)}.log", args, app_spec)
        started.append(inst)
        return inst

    yield start
    for inst in started:
        inst.stop()


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of this test's own, for faults that would hurt a shared one."""
    server = RedisServer(tmp_path)
    yield server
    server.stop()


@pytest.fixture
def chain_instance(start_instance: Callable[..., Instance]) -> Callable[..., Instance]:
    """Like start_instance, running the chain test app."""

    def start(extra_env: dict[str, str] | None = None) -> Instance:
        return start_instance(extra_env, app_spec="tests.apps.chainapp:app")

    return start


@pytest.fixture
def chain_app(make_app: Callable[..., App]) -> App:
    """An App that knows the chain types through the fleet's declaration in Postgres."""
    from tests.apps.chainapp import app as declared

    app = make_app()
    app.types.update(declared.types)
    return app
