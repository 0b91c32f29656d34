"""Processes of the embedded servers: spawn, handshake, wait, terminate, parent death.

Also the one parent-death helper (`parent_death_preexec`) that the supervisor uses for its
pools. Process state comes from psutil, never from parsing /proc. Knows no server in
particular.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import importlib.util
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import psycopg
import redis
from loguru import logger

from hivejobs.embedded.guard import EmbeddedError

INSTALL_HINT = "install the dev extra: pip install 'hivejobs[dev]'"
PROBE_TIMEOUT_S = 2.0


HOST = "127.0.0.1"


def pg_handshake(conninfo: str, timeout: float = PROBE_TIMEOUT_S, **kw: Any) -> bool:
    """A real Postgres handshake: authenticate and run a query."""
    try:
        with psycopg.connect(conninfo, connect_timeout=max(1, int(timeout)), **kw) as conn:
            conn.execute("SELECT 1")
        return True
    except psycopg.Error:
        return False


def redis_handshake(url: str, timeout: float = PROBE_TIMEOUT_S) -> bool:
    """A real Redis handshake: PING answered with PONG (not LOADING, not an auth error)."""
    client = redis.Redis.from_url(url, socket_connect_timeout=timeout, socket_timeout=timeout)
    try:
        return bool(client.ping())
    except (redis.RedisError, OSError):
        return False
    finally:
        client.close()


def tcp_open(host: str, port: int, timeout: float = PROBE_TIMEOUT_S) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


PR_SET_PDEATHSIG = 1  # prctl(2) option: the signal a child gets when its parent dies


def parent_death_preexec(sig: int = signal.SIGKILL) -> Callable[[], None] | None:
    """The one parent-death helper: a callable to run in a child right after fork (a
    ``preexec_fn``, or the first call of a forked pool) that makes it receive ``sig`` when
    the forking thread exits, even by SIGKILL.

    Linux only (returns None elsewhere). Also closes the race where the parent died between
    fork and prctl: the child then exits at once instead of being orphaned. It compares
    getppid() with the parent recorded before the fork, not with 1: under a subreaper (a
    container's init, systemd --user) an orphan's new parent is not pid 1.
    """
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved in the parent, not after fork
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return preexec


# A dead process its parent has not reaped yet: it holds no port and no lock any more.
_EXITED = (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)


def _running(proc: psutil.Process) -> bool:
    """``proc`` still runs: not exited, not a zombie, its pid not taken by another process
    since (psutil compares the start time)."""
    try:
        return proc.is_running() and proc.status() not in _EXITED
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:  # another user's process: it exists
        return True


def proc_alive(pid: int) -> bool:
    """True if ``pid`` runs and is not a zombie."""
    if pid <= 0:
        return False
    try:
        return _running(psutil.Process(pid))
    except psutil.NoSuchProcess:
        return False


def wait_gone(proc: psutil.Process, timeout: float) -> bool:
    """Poll until ``proc`` (not our child) has exited. Not psutil's wait(): for a process
    that is not our child it waits until the pid is reaped, and some container inits reap
    late; an exited zombie is gone for us."""
    deadline = time.monotonic() + timeout
    while _running(proc):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def terminate(
    pid: int,
    sig: int,
    child: subprocess.Popen[bytes] | None,
    timeout: float,
    *,
    sent: bool = False,
) -> None:
    """Send ``sig`` (unless ``sent``), wait up to ``timeout``, then SIGKILL.

    Reaps ``child`` if it is ours. A process started by someone else is signalled and
    watched through psutil, which refuses a pid that another process took since.
    """
    other: psutil.Process | None = None
    if child is None:
        try:
            other = psutil.Process(pid)
        except psutil.NoSuchProcess:
            return
    for s in (sig, signal.SIGKILL):
        if not sent or s == signal.SIGKILL:
            try:
                if other is None:
                    os.kill(pid, s)  # our child: its pid stays ours until we reap it
                else:
                    other.send_signal(s)
            except (ProcessLookupError, psutil.NoSuchProcess):
                break
        if child is not None:
            try:
                child.wait(timeout)
                return
            except subprocess.TimeoutExpired:
                pass
        elif other is not None and wait_gone(other, timeout):
            return
        logger.warning("pid {} did not exit after signal {}; killing it", pid, s)
    if child is not None:
        child.wait(5)
    elif other is not None:
        wait_gone(other, 5)


def free_port(preferred: int | None = None) -> int:
    """A port free on 127.0.0.1 now (the preferred one if it is); the server may still race."""
    for port in ([preferred] if preferred else []) + [0]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            # SO_REUSEADDR as the servers set it: TIME_WAIT leftovers do not make a port busy.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((HOST, port))
            except OSError:
                continue
            return int(s.getsockname()[1])
    raise EmbeddedError("no free TCP port on 127.0.0.1")


def log_tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@dataclass(frozen=True)
class RunAs:
    """The unprivileged user Postgres runs as when we are root."""

    name: str
    uid: int
    gid: int


def package_dir(module: str) -> Path:
    spec = importlib.util.find_spec(module)  # finds without importing the wrapper
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedError(f"the {module} package is missing: {INSTALL_HINT}")
    return Path(next(iter(spec.submodule_search_locations)))


def dist_version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def own_dir(path: Path, mode: int) -> Path:
    """Create (or accept) a directory of ours: real dir, owned by us, not group/other-writable.

    Needed in world-writable /var/tmp, where someone else could pre-create the name.
    """
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise EmbeddedError(
            f"{path} exists but is not a directory owned by uid {os.geteuid()} without"
            " group/other write permission; remove it and retry"
        )
    if stat.S_IMODE(st.st_mode) != mode:
        os.chmod(path, mode)
    return path


def spawn_server(
    argv: list[str],
    log: Path,
    *,
    run_as: RunAs | None,
    detached: bool,
    cwd: Path,
    env: dict[str, str],
) -> subprocess.Popen[bytes]:
    """Start a server as a child in its own session, dying with us unless ``detached``."""
    with open(log, "wb") as logf:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=logf,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=env,
            start_new_session=True,
            preexec_fn=None if detached else parent_death_preexec(),
            user=run_as.uid if run_as else None,
            group=run_as.gid if run_as else None,
            extra_groups=[] if run_as else None,
        )


def await_ready(
    name: str,
    proc: subprocess.Popen[bytes],
    check: Callable[[], bool],
    log: Path,
    deadline: float,
) -> bool:
    """Poll ``check`` (a real handshake) until it passes; False if the process exited."""
    while True:
        if proc.poll() is not None:
            return False
        if check():
            return True
        if time.monotonic() > deadline:
            terminate(proc.pid, signal.SIGKILL, proc, 5)
            raise EmbeddedError(f"{name} did not answer before the deadline:\n{log_tail(log)}")
        time.sleep(0.05)


def start_server(
    name: str,
    argv_for: Callable[[int], list[str]],
    check_for: Callable[[int], Callable[[], bool]],
    log: Path,
    preferred_port: int | None,
    deadline: float,
    **spawn: Any,
) -> tuple[subprocess.Popen[bytes], int]:
    """Start on a free port; retry on another port if it lost the race for the port."""
    for attempt in range(3):
        port = free_port(preferred_port if attempt == 0 else None)
        proc = spawn_server(argv_for(port), log, **spawn)
        if await_ready(name, proc, check_for(port), log, deadline):
            return proc, port
        tail = log_tail(log)
        if "in use" not in tail.lower():
            raise EmbeddedError(f"{name} exited with code {proc.returncode}:\n{tail}")
    raise EmbeddedError(f"{name} could not bind a port:\n{log_tail(log)}")
