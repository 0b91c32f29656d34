"""What keeps the embedded dev servers (``hivejobs dev``) to the user who started them.

* The data dir must be a directory of this user, not writable by group or others: its
  ``servers.json`` names the pids that ``--stop`` signals, so whoever may write it could get
  any process killed.
* Both servers require a password (Postgres SCRAM over 127.0.0.1 only, Valkey
  ``requirepass`` from a 0600 config file, never on a command line that ``ps`` shows). The
  passwords are made once per data dir and kept in ``credentials.json`` (0600).
* A pid from ``servers.json`` is signalled only if that process runs one of *our* server
  binaries (computed here, never read from the state file) and started when recorded
  (psutil's create_time guards against pid reuse).

Never creates users or changes the permissions of a directory it did not create.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import stat
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from hivejobs.errors import HivejobsError

CREDENTIALS_FILE = "credentials.json"
# Written into the cluster once its superuser has the password of credentials.json: the
# sha256 of that password, so a new credentials file (deleted by hand) is applied again.
PG_AUTH_MARKER = "hivejobs.auth"
# Every start rewrites pg_hba.conf: no trust, no unix socket, TCP on 127.0.0.1 with SCRAM.
PG_HBA = (
    "# Written by hivejobs at every start (hivejobs/embedded/guard.py): password only.\n"
    "host all all 127.0.0.1/32 scram-sha-256\n"
)
# Process start times agree to within this (psutil rounds /proc's clock ticks).
_CREATE_TIME_SLACK_S = 1.0


class EmbeddedError(HivejobsError):
    """The embedded servers could not be found, started or stopped."""


def check_data_dir(path: Path) -> None:
    """Refuse a data dir that is not ours or that group/others may write (see module doc)."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise EmbeddedError(f"data dir {path}: {exc.strerror}") from None
    uid = os.geteuid()
    if not stat.S_ISDIR(st.st_mode):
        raise EmbeddedError(f"data dir {path} is not a directory")
    if st.st_uid != uid:
        raise EmbeddedError(
            f"data dir {path} belongs to uid {st.st_uid}, not to you (uid {uid}): its state "
            "file decides which processes get signalled; use a directory of your own"
        )
    if st.st_mode & 0o022:
        raise EmbeddedError(
            f"data dir {path} is writable by group or others (mode "
            f"{stat.S_IMODE(st.st_mode):03o}): another user could rewrite its state file; "
            f"run `chmod 700 {path}` or use another --data-dir"
        )


@dataclass(frozen=True)
class Credentials:
    """The dev servers' passwords; the repr hides them."""

    postgres: str = field(repr=False)
    valkey: str = field(repr=False)

    def postgres_marker(self) -> str:
        return hashlib.sha256(self.postgres.encode()).hexdigest()


def load_credentials(data_dir: Path) -> Credentials:
    """The data dir's passwords, made on first use. Call under the data dir's lock."""
    path = data_dir / CREDENTIALS_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        made = Credentials(secrets.token_urlsafe(24), secrets.token_urlsafe(24))
        tmp = data_dir / f".{CREDENTIALS_FILE}.{os.getpid()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump({"postgres": made.postgres, "valkey": made.valkey}, out)
        os.replace(tmp, path)
        return made
    except OSError as exc:  # ELOOP: a symlink planted in our place
        raise EmbeddedError(f"cannot read {path}: {exc.strerror}") from None
    with os.fdopen(fd) as src:
        st = os.fstat(src.fileno())
        if st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise EmbeddedError(f"{path} must belong to you with mode 600; remove it to reset")
        try:
            data = json.load(src)
            return Credentials(str(data["postgres"]), str(data["valkey"]))
        except (ValueError, KeyError, TypeError):
            raise EmbeddedError(f"{path} is damaged; remove it to make new passwords") from None


def is_our_server(pid: int, allowed_exes: set[str], create_time: float | None) -> bool:
    """True if ``pid`` runs (not a zombie) one of ``allowed_exes`` and, when recorded, started
    at ``create_time``. Anything we cannot check is not ours: we never signal it."""
    if pid <= 0:
        return False
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        exe = os.path.realpath(proc.exe().removesuffix(" (deleted)"))
        started = proc.create_time()
    except (psutil.Error, OSError):
        return False
    if exe not in {os.path.realpath(p) for p in allowed_exes}:
        return False
    return create_time is None or abs(started - create_time) <= _CREATE_TIME_SLACK_S


def process_create_time(pid: int) -> float | None:
    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return None


def valkey_config(password: str) -> str:
    """The config file Valkey reads first (before our command-line options)."""
    return f'requirepass "{password}"\n'
