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

from tests.harness import PostgresServer, free_port, wait_until


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
        self.proc: subprocess.Popen[bytes] | None = None
        try:
            self._start(upstream_port, pool_size, ignore_options)
        except BaseException:
            self.stop()  # a failed start leaves no process and no temp folder behind
            raise

    def _start(self, upstream_port: int, pool_size: int, ignore_options: bool) -> None:
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
        binary = shutil.which("pgbouncer", path=f"{os.environ.get('PATH', '')}:/usr/sbin")
        if binary is None:  # else runuser fails silently and the wait below times out
            raise RuntimeError("pgbouncer is not installed (scripts/test installs Debian's)")
        self.proc = subprocess.Popen(
            _as_postgres([binary, str(ini)]),
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
        if self.proc is not None and self.proc.poll() is None:
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

    def __init__(
        self,
        folder: Path,
        name: str,
        lines: list[str],
        sentinel: bool = False,
        wait: bool = True,
    ) -> None:
        """`wait`: until it answers on `port` (False: TLS only, port 0)."""
        self.folder = folder
        self.port = free_port() if wait else 0
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
        self.start(wait)

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
                if not isinstance(master, dict) or int(master.get("num-slaves", 0)) < 1:
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
            addr = client.sentinel_get_master_addr_by_name(self.SERVICE)
            return int(addr[1]) if isinstance(addr, (list, tuple)) else None
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
                    # The bus port defaults to port + 10000, past 65535 for a high free port.
                    f"cluster-port {free_port()}",
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


class ThrowawayCA:
    """A certificate authority made for one test (openssl), a server certificate for
    127.0.0.1/localhost and a client certificate whose CN is `client_cn`."""

    def __init__(self, folder: Path, client_cn: str = "postgres") -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.ca = folder / "ca.crt"
        self._openssl(
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-keyout", str(folder / "ca.key"), "-out", str(self.ca), "-subj", "/CN=hj test CA",
        )  # fmt: skip
        self.server_cert, self.server_key = self._issue("server", "127.0.0.1", server=True)
        self.client_cert, self.client_key = self._issue("client", client_cn, server=False)

    def _openssl(self, *args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)

    def _issue(self, name: str, cn: str, server: bool) -> tuple[Path, Path]:
        key, csr, crt = (self.folder / f"{name}.{ext}" for ext in ("key", "csr", "crt"))
        ext = self.folder / f"{name}.ext"
        ext.write_text(
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n"
            if server
            else "extendedKeyUsage=clientAuth\n"
        )
        self._openssl(
            "req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr),
            "-subj", f"/CN={cn}",
        )  # fmt: skip
        self._openssl(
            "x509", "-req", "-in", str(csr), "-CA", str(self.ca),
            "-CAkey", str(self.folder / "ca.key"), "-CAcreateserial", "-days", "1",
            "-out", str(crt), "-extfile", str(ext),
        )  # fmt: skip
        os.chmod(key, 0o600)
        return crt, key


class TlsRedis:
    """redis-server answering on TLS only (port 0), client certificates required, the
    default user off and one ACL user: any command that works came over TLS as that user."""

    USER, PASSWORD = "hjapp", "hj-s3cret"

    def __init__(self, folder: Path, ca: ThrowawayCA) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.ca = ca
        self.proc = RedisProcess(
            folder,
            "tls",
            [
                f"tls-port {free_port()}",
                f"tls-cert-file {ca.server_cert}",
                f"tls-key-file {ca.server_key}",
                f"tls-ca-cert-file {ca.ca}",
                "tls-auth-clients yes",
                "user default off",
                f"user {self.USER} on >{self.PASSWORD} ~* &* +@all",
            ],
            wait=False,
        )
        self.port = int(
            next(
                line.split()[1]
                for line in self.proc.conf.read_text().splitlines()
                if line.startswith("tls-port")
            )
        )
        wait_until(lambda: self._answers(), timeout=10, what="TLS redis to answer")

    def _answers(self) -> bool:
        client = redis.Redis.from_url(self.url, socket_timeout=1)
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False
        finally:
            client.close()

    @property
    def url(self) -> str:
        return (
            f"rediss://{self.USER}:{self.PASSWORD}@127.0.0.1:{self.port}/0"
            f"?ssl_ca_certs={self.ca.ca}&ssl_certfile={self.ca.client_cert}"
            f"&ssl_keyfile={self.ca.client_key}"
        )

    def stop(self) -> None:
        self.proc.kill()


def tls_postgres(ca: ThrowawayCA) -> tuple[PostgresServer, str]:
    """A Postgres of the test's own that takes TCP connections over TLS with a client
    certificate only (pg_hba `hostssl ... cert`, plain TCP rejected); returns it and a
    `sslmode=verify-full` URL template with `{db}` for the database name."""
    server = PostgresServer()
    files = {}
    for name, src in (
        ("server.crt", ca.server_cert),
        ("server.key", ca.server_key),
        ("ca.crt", ca.ca),
    ):
        dst = server.dir / name
        shutil.copy(src, dst)
        os.chmod(dst, 0o600)
        if os.geteuid() == 0:
            shutil.chown(dst, "postgres", "postgres")
        files[name] = dst
    with open(server.data / "postgresql.conf", "a") as conf:
        conf.write(
            f"ssl = on\nssl_cert_file = '{files['server.crt']}'\n"
            f"ssl_key_file = '{files['server.key']}'\nssl_ca_file = '{files['ca.crt']}'\n"
        )
    (server.data / "pg_hba.conf").write_text(
        "local all all trust\n"
        "hostssl all all 127.0.0.1/32 cert\n"
        "host all all 127.0.0.1/32 reject\n"
        "host all all ::1/128 reject\n"
    )
    server.restart_fast()
    url = (
        f"postgresql://postgres@127.0.0.1:{server.port}/{{db}}?sslmode=verify-full"
        f"&sslrootcert={ca.ca}&sslcert={ca.client_cert}&sslkey={ca.client_key}"
    )
    return server, url
