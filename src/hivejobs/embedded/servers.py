"""Start, reuse and stop the embedded PostgreSQL + Valkey pair on one data dir."""

from __future__ import annotations

import atexit
import os
import shlex
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from loguru import logger

from hivejobs.embedded.guard import (
    Credentials,
    check_data_dir,
    load_credentials,
    process_create_time,
    valkey_config,
)
from hivejobs.embedded.postgres import (
    PG_SUPERUSER,
    await_stale_postmaster,
    ensure_database,
    initdb,
    pg_bin_dir,
    pg_data_dir,
    pg_env,
    pg_run_as,
    postgres_url,
    private_file,
    secure_cluster,
)
from hivejobs.embedded.process import (
    HOST,
    pg_handshake,
    proc_alive,
    redis_handshake,
    start_server,
    terminate,
)
from hivejobs.embedded.state import (
    default_data_dir,
    forget_pids,
    kill_recorded,
    locked,
    our_binaries,
    read_state,
    recorded_server,
    write_state,
)
from hivejobs.embedded.valkey import valkey_binary, valkey_dir, valkey_url

START_TIMEOUT_S = 30.0


STOP_TIMEOUT_S = 15.0


def export_lines(database_url: str, redis_url: str) -> str:
    """The shell line that points other processes at these servers (one line, eval-able)."""
    return (
        f"export HIVEJOBS_DATABASE_URL={shlex.quote(database_url)} "
        f"HIVEJOBS_REDIS_URL={shlex.quote(redis_url)}"
    )


@dataclass
class EmbeddedServers:
    """Handle on running embedded servers.

    ``owned`` is True when this handle started them attached to this process: ``stop()`` (or
    leaving the ``with`` block, or interpreter exit) then shuts them down. Servers reused from
    another process, or started ``detached``, are left running by ``stop()``; use
    ``stop_embedded(data_dir)`` for those.
    """

    data_dir: Path
    database_url: str = field(repr=False)  # both hold a password
    redis_url: str = field(repr=False)
    postgres_pid: int
    valkey_pid: int
    pg_data_dir: Path
    owned: bool
    detached: bool
    reused: bool
    postgres_version: str
    _procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict, repr=False)
    _stopped: bool = field(default=False, repr=False)

    def env(self) -> dict[str, str]:
        """Environment variables that point another process at these servers."""
        return {"HIVEJOBS_DATABASE_URL": self.database_url, "HIVEJOBS_REDIS_URL": self.redis_url}

    def alive(self) -> bool:
        """Both server processes still run (cheap; no handshake)."""
        return proc_alive(self.postgres_pid) and proc_alive(self.valkey_pid)

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Shut down servers this handle owns (Postgres fast shutdown, Valkey SIGTERM)."""
        if self._stopped or not self.owned:
            self._stopped = True
            return
        self._stopped = True
        with locked(self.data_dir):
            pg, vk = self._procs.get("postgres"), self._procs.get("valkey")
            # Signal both first so that they shut down in parallel.
            for pid, sig in ((self.postgres_pid, signal.SIGINT), (self.valkey_pid, signal.SIGTERM)):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            terminate(self.postgres_pid, signal.SIGINT, pg, timeout, sent=True)
            terminate(self.valkey_pid, signal.SIGTERM, vk, timeout, sent=True)
            state = read_state(self.data_dir)
            if state and state.get("postgres", {}).get("pid") == self.postgres_pid:
                forget_pids(self.data_dir, state)
        logger.info("embedded servers stopped (data kept in {})", self.data_dir)

    def __enter__(self) -> EmbeddedServers:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _reuse(data_dir: Path, state: dict[str, Any], creds: Credentials) -> EmbeddedServers | None:
    """A handle on servers recorded in ``state`` if both still run and answer."""
    ours = our_binaries()
    pg_pid = recorded_server(state.get("postgres"), ours)
    vk_pid = recorded_server(state.get("valkey"), ours)
    if pg_pid is None or vk_pid is None:
        return None
    try:
        pg, vk = state["postgres"], state["valkey"]
        pg_port, vk_port = int(pg["port"]), int(vk["port"])
    except (KeyError, TypeError, ValueError):
        return None
    db_url, rd_url = postgres_url(pg_port, creds.postgres), valkey_url(vk_port, creds.valkey)
    if not (pg_handshake(db_url) and redis_handshake(rd_url)):
        return None
    anonymous_pg = f"host={HOST} port={pg_port} user={PG_SUPERUSER} dbname=postgres"
    if pg_handshake(anonymous_pg) or redis_handshake(f"redis://{HOST}:{vk_port}/0"):
        # Started by an older hivejobs, open to every local user: restart them with passwords.
        logger.warning("embedded servers without passwords found: restarting them")
        return None
    return EmbeddedServers(
        data_dir=data_dir,
        database_url=db_url,
        redis_url=rd_url,
        postgres_pid=pg_pid,
        valkey_pid=vk_pid,
        pg_data_dir=Path(str(pg.get("data_dir", data_dir / "pg"))),
        owned=False,
        detached=bool(state.get("detached")),
        reused=True,
        postgres_version=str(pg.get("version", "")),
    )


def start_embedded(
    data_dir: Path | None = None,
    *,
    detached: bool = False,
    timeout: float = START_TIMEOUT_S,
) -> EmbeddedServers:
    """Start (or reuse) embedded PostgreSQL + Valkey on 127.0.0.1 with data in ``data_dir``.

    Returns once both answer a real handshake (psycopg query, Redis PING) and the database
    ``hivejobs`` exists. ``detached`` servers do not die with this process (for
    ``hivejobs dev --print-env``); stop them with ``stop_embedded``. Call from the main thread:
    attached servers die when the thread that started them exits (see module docstring).
    """
    data_dir = Path(data_dir).expanduser() if data_dir else default_data_dir()
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    data_dir = data_dir.resolve()
    check_data_dir(data_dir)
    if not detached and threading.current_thread() is not threading.main_thread():
        logger.warning(
            "embedded servers started from thread {!r} die when that thread exits",
            threading.current_thread().name,
        )
    t0 = time.monotonic()
    deadline = t0 + timeout
    with locked(data_dir):
        creds = load_credentials(data_dir)
        state = read_state(data_dir)
        if state:
            reused = _reuse(data_dir, state, creds)
            if reused is not None:
                logger.info(
                    "reusing embedded servers in {} (postgres pid {}, valkey pid {})",
                    data_dir,
                    reused.postgres_pid,
                    reused.valkey_pid,
                )
                return reused
            kill_recorded(state, STOP_TIMEOUT_S)  # half-alive leftovers
            forget_pids(data_dir, state)
        run_as = pg_run_as()
        bin_dir, version = pg_bin_dir(run_as)
        valkey = valkey_binary(run_as)
        pgdata = pg_data_dir(data_dir, run_as)
        logs = data_dir / "logs"
        logs.mkdir(exist_ok=True, mode=0o700)
        vdir = valkey_dir(data_dir, pgdata, run_as)
        private_file(vdir / "valkey.conf", valkey_config(creds.valkey), run_as)
        cold = not (pgdata / "PG_VERSION").exists()
        if cold:
            initdb(bin_dir, pgdata, run_as, logs / "initdb.log", creds)
        await_stale_postmaster(pgdata, deadline)
        secure_cluster(bin_dir, pgdata, run_as, logs / "postgres.log", creds)
        old = state or {}
        procs: dict[str, subprocess.Popen[bytes]] = {}
        try:
            pg_proc, pg_port = start_server(
                "postgres",
                lambda port: [
                    str(bin_dir / "postgres"),
                    "-D",
                    str(pgdata),
                    "-c",
                    f"listen_addresses={HOST}",
                    "-c",
                    f"port={port}",
                    "-c",
                    "unix_socket_directories=",
                    "-c",
                    "logging_collector=off",
                ],
                lambda port: (
                    lambda: pg_handshake(
                        f"host={HOST} port={port} user={PG_SUPERUSER} dbname=postgres",
                        1.0,
                        password=creds.postgres,
                    )
                ),
                logs / "postgres.log",
                (old.get("postgres") or {}).get("port"),
                deadline,
                run_as=run_as,
                detached=detached,
                cwd=pgdata.parent,
                env=pg_env(pgdata.parent),
            )
            procs["postgres"] = pg_proc
            vk_proc, vk_port = start_server(
                "valkey",
                lambda port: [
                    str(valkey),
                    str(vdir / "valkey.conf"),  # the password, kept off the command line
                    "--bind",
                    HOST,
                    "--port",
                    str(port),
                    "--dir",
                    str(vdir),
                    "--daemonize",
                    "no",
                    "--protected-mode",
                    "yes",
                    "--appendonly",
                    "yes",
                    "--logfile",
                    "",
                ],
                lambda port: lambda: redis_handshake(valkey_url(port, creds.valkey), 1.0),
                logs / "valkey.log",
                (old.get("valkey") or {}).get("port"),
                deadline,
                run_as=run_as,  # never root: the unprivileged user Postgres runs as
                detached=detached,
                cwd=vdir,
                env={"PATH": os.defpath, "HOME": str(vdir)},
            )
            procs["valkey"] = vk_proc
            ensure_database(postgres_url(pg_port, creds.postgres))
        except BaseException:
            for name, proc in procs.items():
                sig = signal.SIGINT if name == "postgres" else signal.SIGTERM
                terminate(proc.pid, sig, proc, STOP_TIMEOUT_S)
            raise
        write_state(
            data_dir,
            {
                "owner_pid": os.getpid(),
                "detached": detached,
                "postgres": {
                    "pid": pg_proc.pid, "port": pg_port, "exe": str(bin_dir / "postgres"),
                    "create_time": process_create_time(pg_proc.pid),
                    "data_dir": str(pgdata), "version": version,
                },
                "valkey": {
                    "pid": vk_proc.pid, "port": vk_port, "exe": str(valkey),
                    "create_time": process_create_time(vk_proc.pid),
                },
            },
        )  # fmt: skip
    servers = EmbeddedServers(
        data_dir=data_dir,
        database_url=postgres_url(pg_port, creds.postgres),
        redis_url=valkey_url(vk_port, creds.valkey),
        postgres_pid=pg_proc.pid,
        valkey_pid=vk_proc.pid,
        pg_data_dir=pgdata,
        owned=not detached,
        detached=detached,
        reused=False,
        postgres_version=version,
        _procs=procs,
    )
    if not detached:
        atexit.register(servers.stop)
    logger.info(
        "embedded PostgreSQL {} on port {} and Valkey on port {} ready in {:.2f}s ({} start;"
        " data in {})",
        version, pg_port, vk_port, time.monotonic() - t0, "cold" if cold else "warm", data_dir,
    )  # fmt: skip
    return servers


def stop_embedded(data_dir: Path | None = None, timeout: float = STOP_TIMEOUT_S) -> bool:
    """Stop the servers recorded in ``data_dir`` whoever started them (``hivejobs dev --stop``).

    Returns True if something was running. Data is kept.
    """
    data_dir = Path(data_dir).expanduser() if data_dir else default_data_dir()
    if not data_dir.is_dir():
        return False
    check_data_dir(data_dir)  # whoever may write servers.json must not choose what we kill
    with locked(data_dir):
        state = read_state(data_dir)
        if not state:
            return False
        stopped = kill_recorded(state, timeout)
        forget_pids(data_dir, state)
    if stopped:
        logger.info("embedded servers in {} stopped", data_dir)
    return stopped
