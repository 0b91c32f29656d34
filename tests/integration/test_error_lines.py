"""Error lines that fit their case: each says what is wrong and the one thing to do, once."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hivejobs import App
from hivejobs.broker import Broker
from hivejobs.client.app import load_app
from hivejobs.config import settings_from_env
from hivejobs.errors import ConnectionFailed, UnknownJobType, UsageError
from tests.harness import REDIS_URL, db_url, free_port, sql


@pytest.fixture
def module_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    name = f"fh_jobs_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text("from hivejobs import App\nmain = App()\nApp2 = App\n")
    monkeypatch.chdir(tmp_path)
    yield tmp_path / name
    sys.modules.pop(name, None)


def test_module_app_errors_say_the_form_and_what_is_missing(module_dir: Path) -> None:
    name = module_dir.name
    with pytest.raises(UsageError, match=rf"is a file path; give MODULE:APP.* e\.g\. {name}:main"):
        load_app(f"./{name}.py:main")
    with pytest.raises(
        UsageError, match=rf"module '{name}' has no attribute 'app' \(its Apps: main\)"
    ):
        load_app(name)
    with pytest.raises(UsageError, match=r"App2 is a type, not a hivejobs App \(its Apps: main\)"):
        load_app(f"{name}:App2")
    assert isinstance(load_app(f"{name}:main"), App)


def test_enqueue_before_any_worker_says_start_one_or_pass_the_app(
    make_app: Callable[..., App],
) -> None:
    app = make_app()  # no type of its own, none declared by a worker in this database
    with pytest.raises(UnknownJobType) as info:
        app.enqueue("mail", {})
    assert "start a worker once" in str(info.value) and "--app MODULE:APP" in str(info.value)


def test_a_missing_database_is_not_told_to_check_that_the_server_runs(admin_url: str) -> None:
    name = f"hjtest_missing_{uuid.uuid4().hex[:12]}"
    app = App(database_url=db_url(admin_url, name), redis_url=REDIS_URL)
    try:
        with pytest.raises(ConnectionFailed) as info:
            app.connections.store  # noqa: B018 - connecting is the point
    finally:
        sql(admin_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    text = str(info.value)
    assert text.endswith("; run `hivejobs migrate`, which creates it")
    assert "check that it runs" not in text


def test_a_refused_connection_reads_as_one_sentence() -> None:
    port = free_port()
    settings = settings_from_env("postgresql://127.0.0.1/x", f"redis://127.0.0.1:{port}/0")
    broker = Broker(settings)
    try:
        with pytest.raises(ConnectionFailed) as info:
            broker.ping()
    finally:
        broker.close()
    app = App(database_url=f"postgresql://127.0.0.1:{port}/x", redis_url=REDIS_URL)
    with pytest.raises(ConnectionFailed) as pg:
        app.connections.store  # noqa: B018
    for text in (str(info.value), str(pg.value)):
        assert ".;" not in text and "?;" not in text, text
        assert text.endswith("Connection refused; check that it runs and that the URL is right")
