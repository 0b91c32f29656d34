"""Harness of real processes, shared by the chaos scenarios (bench/chaos*.py) and the test
suite (tests/harness.py re-exports it): servers of our own, waiting, the handlers' ledger,
`hivejobs run` instances. It lives under bench/ so that the chaos code never reaches into the
test suite; it must not import from tests/ (the apps it starts are named by their spec only).

Cross-process waits poll a condition with a deadline (wait_until); never a fixed sleep.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parents[1]
REDIS_URL = os.environ.get("HIVEJOBS_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")

# Test speed settings (RELIABILITY.md 4.0); production defaults are in config.Settings.
FAST_SETTINGS: dict[str, float] = {
    "heartbeat_s": 1.0,
    "stuck_after_s": 5.0,
    "coordinator_interval_s": 0.5,
    "promote_interval_s": 0.1,
    "lease_ttl_s": 5.0,
    "lease_renew_s": 1.0,
    "shutdown_timeout_s": 5.0,
    "stop_grace_s": 2.0,
    "timeout_grace_s": 1.0,
}


def wait_until(
    predicate: Callable[..., Any],
    timeout: float = 60.0,
    interval: float = 0.05,
    what: str = "condition",
) -> Any:
    """Poll until predicate() is truthy; return its value, or fail with `what`.

    The timeout only bounds a failure (a passing wait returns as soon as it holds): 60 s,
    since an instance starting four pools took over 30 s on a 2-core machine at load 10.

    `...`: loops bind their variables as lambda defaults (`lambda k=kind: ...`), and mypy
    types such a lambda only against a signature that admits the extra parameters."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def pg_admin_url() -> str:
    """The maintenance database as whichever superuser this machine has (postgres or root),
    or HIVEJOBS_TEST_DATABASE_URL (`postgresql://user@host:port/postgres`, a role that may
    create databases) for a server elsewhere. The suite creates databases named `hjtest_*`
    there and drops only those it created."""
    configured = os.environ.get("HIVEJOBS_TEST_DATABASE_URL")
    if configured:
        return configured
    for user in (os.environ.get("PGUSER"), "postgres", "root"):
        if not user:
            continue
        url = f"postgresql://{user}@127.0.0.1:5432/postgres"
        try:
            psycopg.connect(url, connect_timeout=3).close()
            return url
        except psycopg.OperationalError:
            continue
    raise RuntimeError(
        "no Postgres superuser answers on 127.0.0.1:5432 (run scripts/test, or set "
        "HIVEJOBS_TEST_DATABASE_URL)"
    )


def db_url(admin_url: str, name: str) -> str:
    return admin_url.rsplit("/", 1)[0] + "/" + name


def sql(url: str, query: str, params: Any = None) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(query, params)
        return cur.fetchall() if cur.description else []


def live_jobs(url: str) -> int:
    """Jobs not yet finished (scheduled, queued or running)."""
    return int(sql(url, "SELECT count(*) FROM hivejobs_job")[0][0])


# -- ledger: one line per handler event, O_APPEND, survives kill -9 ----------------------


def read_ledger(folder: Path) -> list[list[str]]:
    """Every complete line: a read beside a worker's write may see that line in part (one
    such read, `end <id>` without its outcome, failed test_tls once); the next read has it
    whole. Every line the ledger writes ends with a newline."""
    lines = []
    for path in folder.glob("ledger.*"):
        complete = path.read_text().rpartition("\n")[0]
        lines += [line.split() for line in complete.splitlines() if line.strip()]
    return lines


def ledger_starts(folder: Path) -> Counter[str]:
    return Counter(parts[1] for parts in read_ledger(folder) if parts[0] == "start")


def ledger_oks(folder: Path, killed: set[int] | frozenset[int] = frozenset()) -> Counter[str]:
    """Successful handler ends per job, leaving out processes the test killed: an attempt
    that ended but whose completion was not yet committed is re-run, by design (I4)."""
    return Counter(
        parts[1]
        for parts in read_ledger(folder)
        if parts[0] == "end" and parts[3] == "ok" and int(parts[4]) not in killed
    )


def running_in_pid(folder: Path, pid: int, prefix: str = "") -> set[str]:
    """Jobs with a start line from `pid` and no end line from it yet (mid-run)."""
    started: set[str] = set()
    for parts in read_ledger(folder):
        if parts[0] == "start" and int(parts[3]) == pid and parts[1].startswith(prefix):
            started.add(parts[1])
        elif parts[0] == "end" and int(parts[4]) == pid:
            started.discard(parts[1])
    return started


# -- a real `hivejobs run` instance ------------------------------------------------------


class Instance:
    """`hivejobs run APP` (the fault test app by default) in its own session (pgid == pid)."""

    def __init__(
        self,
        env: dict[str, str],
        log_path: Path,
        extra_args: list[str] | None = None,
        app_spec: str = "tests.apps.faultapp:app",
    ):
        self.log_path = log_path
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        args = [sys.executable, "-m", "hivejobs", "run", app_spec, *(extra_args or [])]
        self.proc = subprocess.Popen(
            args,
            cwd=ROOT,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.pid = self.proc.pid

    def signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            pass

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.signal_group(signal.SIGKILL)
            self.proc.wait(10)
        else:
            self.signal_group(signal.SIGKILL)  # children left behind, if any
        self._log.close()

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")


def pool_pids(url: str, pool: str, host_pid: int | None = None) -> list[int]:
    """Live pool process pids for a type, from the workers table."""
    rows = sql(url, "SELECT pid FROM hivejobs_worker WHERE role = 'pool' AND pool = %s", (pool,))
    pids = [r[0] for r in rows if _alive(r[0])]
    if host_pid is not None:
        pids = [p for p in pids if _parent(p) == host_pid]
    return pids


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/stat")
    try:
        return status.read_text().split(") ", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        # Reading /proc/PID/stat of a process exiting right now can raise ESRCH.
        return False


def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].split()[1])
    except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
        return -1


def alive(pid: int) -> bool:
    return _alive(pid)


def worker_processes(database_url: str) -> set[int]:
    """A worker's processes, from the database they work on: those it knows (pools and the
    coordinator, in hivejobs_worker) and their parent, the supervisor. Empty while the
    database or its tables are not there yet."""
    try:
        pids = {int(r[0]) for r in sql(database_url, "SELECT pid FROM hivejobs_worker")}
    except psycopg.Error:
        return set()
    return pids | {_parent(p) for p in pids}


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """redis-server on a free port, no persistence: a restart is an empty Redis, as in CI."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        import redis

        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.folder),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(port=self.port, socket_timeout=1)

        def answers() -> bool:
            try:
                return bool(client.ping())
            except redis.RedisError:
                return False

        wait_until(answers, timeout=10, what="redis-server to answer")
        client.close()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


class PostgresServer:
    """A throwaway Postgres cluster of this test's own (initdb, fsync off), so that it can be
    restarted, crashed and have its backends killed without touching the shared server.
    As root the server runs as the `postgres` user (Postgres refuses root)."""

    def __init__(self) -> None:
        import glob
        import shutil
        import tempfile

        found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
        self.bin = Path(found[-1]).parent if found else Path(shutil.which("pg_ctl") or "").parent
        self.dir = Path(tempfile.mkdtemp(prefix="hj-pg-"))
        self.data = self.dir / "data"
        self.port = free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")
        self.start()

    def _run(self, tool: str, *args: str) -> None:
        cmd = [str(self.bin / tool), *args]
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        subprocess.run(cmd, check=True, capture_output=True, timeout=60)

    def _ctl(self, *args: str) -> None:
        opts = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -c fsync=off "
            f"-c unix_socket_directories={self.dir} -c max_connections=200"
        )
        self._run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-o",
            opts,
            "-l",
            str(self.dir / "log"),
            "-w",
            "-t",
            "30",
            *args,
        )

    def start(self) -> None:
        self._ctl("start")

    def restart_fast(self) -> None:
        self._ctl("-m", "fast", "restart")

    def stop_immediate(self) -> None:
        """A crash: no checkpoint, crash recovery on the next start."""
        self._ctl("-m", "immediate", "stop")

    def terminate_backends(self) -> int:
        rows = sql(
            self.url,
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE pid <> pg_backend_pid() AND backend_type = 'client backend'",
        )
        return int(rows[0][0])

    def close(self) -> None:
        import shutil

        try:
            self._ctl("-m", "immediate", "stop")
        except subprocess.CalledProcessError:
            pass
        shutil.rmtree(self.dir, ignore_errors=True)
