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
import redis

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


def _redis_answers(port: int, **kwargs: Any) -> bool:
    client = redis.Redis(port=port, socket_timeout=1, **kwargs)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


class RedisProcess:
    """One redis-server (or sentinel) of the test's own: its config file, its port."""

    def __init__(self, folder: Path, name: str, lines: list[str], sentinel: bool = False):
        self.folder = folder
        self.port = free_port()
        self.conf = folder / f"{name}.conf"
        self.conf.write_text(
            "\n".join(
                [
                    f"port {self.port}",
                    "bind 127.0.0.1",
                    f"dir {folder}",
                    'save ""',
                    "appendonly no",
                    *lines,
                ]
            )
            + "\n"
        )
        self.sentinel = sentinel
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self, wait: bool = True) -> None:
        args = ["redis-server", str(self.conf)] + (["--sentinel"] if self.sentinel else [])
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if wait:
            wait_until(lambda: _redis_answers(self.port), timeout=10, what="redis to answer")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


class RedisSentinelSet:
    """A master, a replica and three sentinels (quorum 2), failover after 1 s down."""

    SERVICE = "hjmaster"

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.master = RedisProcess(folder, "master", [])
        self.replica = RedisProcess(folder, "replica", [f"replicaof 127.0.0.1 {self.master.port}"])
        self.sentinels = [
            RedisProcess(
                folder,
                f"sentinel{i}",
                [
                    f"sentinel monitor {self.SERVICE} 127.0.0.1 {self.master.port} 2",
                    f"sentinel down-after-milliseconds {self.SERVICE} 1000",
                    f"sentinel failover-timeout {self.SERVICE} 4000",
                ],
                sentinel=True,
            )
            for i in range(3)
        ]
        wait_until(self._replica_synced, timeout=15, what="the replica to sync")
        wait_until(self._sentinels_see_replica, timeout=15, what="sentinels to see it all")

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{self.SERVICE}/0"

    def _replica_synced(self) -> bool:
        client = redis.Redis(port=self.replica.port, socket_timeout=1)
        try:
            info = client.info("replication")
            return info.get("master_link_status") == "up"
        except redis.RedisError:
            return False
        finally:
            client.close()

    def _sentinels_see_replica(self) -> bool:
        for s in self.sentinels:
            client = redis.Redis(port=s.port, socket_timeout=1)
            try:
                master = client.sentinel_master(self.SERVICE)
                if int(master.get("num-slaves", 0)) < 1:
                    return False
                if int(master.get("num-other-sentinels", 0)) < 2:
                    return False
            except redis.RedisError:
                return False
            finally:
                client.close()
        return True

    def master_port(self) -> int | None:
        """The port the sentinels name as master now."""
        client = redis.Redis(port=self.sentinels[0].port, socket_timeout=1)
        try:
            addr = client.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.SERVICE)
            return int(addr[1])
        except (redis.RedisError, TypeError, IndexError):
            return None
        finally:
            client.close()

    def stop(self) -> None:
        for proc in [*self.sentinels, self.replica, self.master]:
            proc.kill()


class RedisClusterSet:
    """Three masters, no replicas, made with `redis-cli --cluster create`."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.nodes = [
            RedisProcess(
                folder,
                f"node{i}",
                [
                    "cluster-enabled yes",
                    f"cluster-config-file nodes{i}.conf",
                    "cluster-node-timeout 2000",
                ],
            )
            for i in range(3)
        ]
        subprocess.run(
            [
                "redis-cli",
                "--cluster",
                "create",
                *[f"127.0.0.1:{n.port}" for n in self.nodes],
                "--cluster-replicas",
                "0",
                "--cluster-yes",
            ],
            check=True,
            capture_output=True,
            timeout=30,
        )
        wait_until(self._ok, timeout=20, what="cluster_state:ok")

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def _ok(self) -> bool:
        for n in self.nodes:
            client = redis.Redis(port=n.port, socket_timeout=1)
            try:
                if client.cluster("info").get("cluster_state") != "ok":
                    return False
            except redis.RedisError:
                return False
            finally:
                client.close()
        return True

    def node_of(self, key: str) -> RedisProcess:
        """The master that serves `key`'s slot."""
        client = redis.Redis(port=self.nodes[0].port, socket_timeout=1)
        try:
            slot = int(client.cluster("keyslot", key))
            for start, end, master, *_ in client.cluster("slots"):
                if start <= slot <= end:
                    port = int(master[1])
                    return next(n for n in self.nodes if n.port == port)
        finally:
            client.close()
        raise AssertionError(f"no node serves {key}")

    def stop(self) -> None:
        for n in self.nodes:
            n.kill()
