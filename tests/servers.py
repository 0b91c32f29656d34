"""Engines operators put in front of or around Postgres and Redis, started by the tests
themselves on free ports in a temp dir and stopped afterwards: PgBouncer in transaction
mode, Redis Sentinel (a master, a replica, three sentinels), a 3-master Redis Cluster, and a
throwaway certificate authority for TLS. Never touches the shared servers' settings.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import psycopg

from tests.harness import free_port, wait_until


def _as_postgres(cmd: list[str]) -> list[str]:
    """PgBouncer and Postgres refuse to run as root: run them as the postgres user."""
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


def _own_folder(prefix: str) -> Path:
    """A temp dir the postgres user can use (pytest's tmp_path is root's alone)."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    if os.geteuid() == 0:
        shutil.chown(folder, "postgres", "postgres")
    return folder


class PgBouncer:
    """pgbouncer (Debian's package, as scripts/test installs it) in transaction mode, stock
    settings otherwise: startup `options` refused, no session state kept between
    transactions. Forwards every database to the shared Postgres; `pool_size` server
    connections per (database, user)."""

    def __init__(
        self, upstream_port: int = 5432, pool_size: int = 4, ignore_options: bool = False
    ) -> None:
        """`ignore_options`: drop startup `options` silently instead of refusing them (a
        common workaround that loses every setting sent that way)."""
        self.folder = _own_folder("hj-pgbouncer-")
        self.port = free_port()
        users = ("postgres", "root")
        (self.folder / "userlist.txt").write_text("".join(f'"{u}" ""\n' for u in users))
        ini = self.folder / "pgbouncer.ini"
        ini.write_text(
            "[databases]\n"
            f"* = host=127.0.0.1 port={upstream_port}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {self.folder / 'userlist.txt'}\n"
            "pool_mode = transaction\n"
            f"default_pool_size = {pool_size}\n"
            "max_client_conn = 500\n"
            f"admin_users = {', '.join(users)}\n"
            f"logfile = {self.folder / 'pgbouncer.log'}\n"
            f"ignore_startup_parameters = {'options' if ignore_options else ''}\n"
            f"pidfile = {self.folder / 'pgbouncer.pid'}\n"
        )
        self.proc = subprocess.Popen(
            _as_postgres(["pgbouncer", str(ini)]),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_until(self._answers, timeout=10, what="pgbouncer to answer")

    def url(self, direct_url: str) -> str:
        """The same user and database as `direct_url`, through this pooler."""
        return direct_url.replace(":5432/", f":{self.port}/", 1)

    def _answers(self) -> bool:
        try:
            self.show("VERSION")
            return True
        except psycopg.Error:
            return False

    def show(self, what: str) -> list[dict[str, Any]]:
        """A SHOW of the admin console (simple query protocol only, hence exec_)."""
        user = "postgres" if os.geteuid() != 0 else "root"
        url = f"postgresql://{user}@127.0.0.1:{self.port}/pgbouncer"
        with psycopg.connect(url, autocommit=True, connect_timeout=3) as conn:
            result = conn.pgconn.exec_(f"SHOW {what}".encode())
            names = [(result.fname(i) or b"").decode() for i in range(result.nfields)]
            return [
                {
                    names[c]: (v.decode() if (v := result.get_value(r, c)) is not None else None)
                    for c in range(result.nfields)
                }
                for r in range(result.ntuples)
            ]

    def connections(self, database: str) -> tuple[int, int]:
        """(client connections, server connections) for one database."""
        clients = [c for c in self.show("CLIENTS") if c["database"] == database]
        servers = [s for s in self.show("SERVERS") if s["database"] == database]
        return len(clients), len(servers)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        shutil.rmtree(self.folder, ignore_errors=True)
