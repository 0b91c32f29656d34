"""choose_backends(): explicit URLs, else answering local servers, else embedded ones."""

from __future__ import annotations

import os
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import redis

from hivejobs import backends
from hivejobs.backends import BackendUnavailable, choose_backends
from hivejobs.embedded import servers
from hivejobs.embedded.postgres import ROOT_CACHE
from hivejobs.embedded.process import redis_handshake
from hivejobs.embedded.servers import stop_embedded
from hivejobs.urls import redact_url

pytestmark = pytest.mark.timeout(180)

ENV = ("HIVEJOBS_DATABASE_URL", "HIVEJOBS_REDIS_URL", "DATABASE_URL", "REDIS_URL")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    for name in (*ENV, "HIVEJOBS_EMBEDDED"):
        monkeypatch.delenv(name, raising=False)
    data_dir = tmp_path / "data"
    monkeypatch.setenv("HIVEJOBS_DATA_DIR", str(data_dir))
    yield
    stop_embedded(data_dir)
    link = data_dir / "pg"
    if link.is_symlink():  # root mode: remove our cluster dir too
        home = Path(os.path.realpath(link)).parent
        if home.parent.parent == ROOT_CACHE:
            shutil.rmtree(home, ignore_errors=True)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens once closed


@pytest.fixture
def no_local_servers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        backends, "DEFAULT_DATABASE_URL", f"postgresql://127.0.0.1:{closed_port()}/hivejobs"
    )
    monkeypatch.setattr(backends, "DEFAULT_REDIS_URL", f"redis://127.0.0.1:{closed_port()}/0")


def local_servers_answer() -> bool:
    return backends.probe_local_postgres(
        backends.DEFAULT_DATABASE_URL
    ) is not None and redis_handshake(backends.DEFAULT_REDIS_URL)


def forbid_probing(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*args: object, **kwargs: object) -> None:
        raise AssertionError("explicit URLs must not be probed")

    for name in ("probe_local_postgres", "redis_handshake"):
        monkeypatch.setattr(backends, name, boom)
    monkeypatch.setattr(servers, "start_embedded", boom)


# --------------------------------------------------------------------------- explicit


def test_explicit_arguments_are_used_without_probing(monkeypatch: pytest.MonkeyPatch) -> None:
    forbid_probing(monkeypatch)
    monkeypatch.setenv("HIVEJOBS_DATABASE_URL", "postgresql://env/ignored")
    b = choose_backends("postgresql://u:secret@db.invalid/x", "redis://r.invalid:1/2")
    assert (b.database_url, b.redis_url, b.source) == (
        "postgresql://u:secret@db.invalid/x",
        "redis://r.invalid:1/2",
        "explicit",
    )
    assert b.embedded is None


@pytest.mark.parametrize("prefix", ["HIVEJOBS_", ""])
def test_explicit_environment_is_used_without_probing(
    monkeypatch: pytest.MonkeyPatch, prefix: str
) -> None:
    forbid_probing(monkeypatch)
    monkeypatch.setenv("HIVEJOBS_EMBEDDED", "1")  # explicit URLs still win
    monkeypatch.setenv(prefix + "DATABASE_URL", "postgresql://db.invalid/x")
    monkeypatch.setenv(prefix + "REDIS_URL", "redis://r.invalid:1/0")
    b = choose_backends()
    assert (b.database_url, b.redis_url, b.source) == (
        "postgresql://db.invalid/x",
        "redis://r.invalid:1/0",
        "explicit",
    )


def test_hivejobs_variables_win_over_generic_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    forbid_probing(monkeypatch)
    monkeypatch.setenv("DATABASE_URL", "postgresql://generic/x")
    monkeypatch.setenv("REDIS_URL", "redis://generic:1/0")
    monkeypatch.setenv("HIVEJOBS_DATABASE_URL", "postgresql://ours/x")
    monkeypatch.setenv("HIVEJOBS_REDIS_URL", "redis://ours:1/0")
    b = choose_backends()
    assert (b.database_url, b.redis_url) == ("postgresql://ours/x", "redis://ours:1/0")


def test_half_explicit_with_no_local_other_half_says_what_to_set(
    monkeypatch: pytest.MonkeyPatch, no_local_servers: None
) -> None:
    monkeypatch.setenv("HIVEJOBS_DATABASE_URL", "postgresql://db.invalid/x")
    with pytest.raises(BackendUnavailable, match="HIVEJOBS_REDIS_URL"):
        choose_backends()


def test_passwords_are_redacted() -> None:
    assert redact_url("postgresql://u:secret@h:5/db") == "postgresql://u:***@h:5/db"
    assert redact_url("redis://:secret@h:6/0") == "redis://:***@h:6/0"
    assert redact_url("redis://h:6/0") == "redis://h:6/0"


# --------------------------------------------------------------------------- local


def test_answering_local_servers_are_used() -> None:
    if not local_servers_answer():
        pytest.skip("no Postgres on 127.0.0.1:5432 and Redis on 127.0.0.1:6379 here")
    b = choose_backends()
    assert b.source == "local" and b.embedded is None
    assert b.redis_url == backends.DEFAULT_REDIS_URL
    assert (
        b.database_url.startswith("postgresql://") and "@127.0.0.1:5432/hivejobs" in b.database_url
    )
    # The URL names a user that can log in (the hivejobs db itself is the caller's job).
    with psycopg.connect(b.database_url.rsplit("/", 1)[0] + "/postgres") as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_local_probe_tries_pguser_first(monkeypatch: pytest.MonkeyPatch) -> None:
    if not local_servers_answer():
        pytest.skip("no local Postgres here")
    monkeypatch.setenv("PGUSER", "no_such_role_hivejobs")  # fails, then the next candidates
    b = choose_backends()
    assert b.source == "local"
    assert "no_such_role_hivejobs" not in b.database_url


# --------------------------------------------------------------------------- embedded


def test_unreachable_local_servers_mean_embedded(no_local_servers: None, tmp_path: Path) -> None:
    b = choose_backends()
    assert b.source == "embedded" and b.embedded is not None
    assert b.embedded.data_dir == (tmp_path / "data").resolve()
    with psycopg.connect(b.database_url) as conn:
        assert conn.execute("SELECT current_database()").fetchone() == ("hivejobs",)
    assert redis.Redis.from_url(b.redis_url).ping()
    b.embedded.stop()


def test_hivejobs_embedded_1_forces_embedded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HIVEJOBS_EMBEDDED", "1")
    monkeypatch.setattr(
        backends, "probe_local_postgres", lambda url: pytest.fail("must not probe local")
    )
    b = choose_backends()
    assert b.source == "embedded" and b.embedded is not None
    assert b.database_url != backends.DEFAULT_DATABASE_URL
    b.embedded.stop()


def test_hivejobs_embedded_0_raises_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, no_local_servers: None
) -> None:
    monkeypatch.setenv("HIVEJOBS_EMBEDDED", "0")
    monkeypatch.setattr(servers, "start_embedded", lambda *a, **k: pytest.fail("no embedded"))
    with pytest.raises(BackendUnavailable) as info:
        choose_backends()
    message = str(info.value)
    assert "HIVEJOBS_DATABASE_URL" in message and "HIVEJOBS_REDIS_URL" in message
