"""The backend choice: which Postgres and which Redis a process uses, and why. One place.

1. explicit: arguments, else HIVEJOBS_DATABASE_URL / HIVEJOBS_REDIS_URL, else DATABASE_URL /
   REDIS_URL (what Heroku-style platforms set): `configured_urls`. Both given: used as they
   are, never probed (`explicit_urls`); the caller fails loudly if they do not answer.
2. local: the defaults (127.0.0.1:5432 and :6379) if both answer a handshake.
3. embedded: servers of `hivejobs dev` (hivejobs.embedded), unless HIVEJOBS_EMBEDDED=0.

`Settings` (config.py), `Connections.resolve` (client/connections.py), `hivejobs dev` and
`hivejobs bench` all ask here. Imports nothing of ours but errors and the embedded servers'
process helpers; the servers themselves are loaded only when they are started.
"""

from __future__ import annotations

import getpass
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal
from urllib.parse import quote, urlsplit, urlunsplit

import psycopg
from loguru import logger
from psycopg.conninfo import conninfo_to_dict

# Named here as well (explicitly exported): the probes read them as this module's globals, so a
# test can point them at closed ports.
from hivejobs.config import DEFAULT_DATABASE_URL as DEFAULT_DATABASE_URL
from hivejobs.config import DEFAULT_REDIS_URL as DEFAULT_REDIS_URL
from hivejobs.config import configured_urls, explicit_urls
from hivejobs.embedded.process import (
    HOST,
    INSTALL_HINT,
    PROBE_TIMEOUT_S,
    redis_handshake,
    tcp_open,
)
from hivejobs.errors import ConfigError

if TYPE_CHECKING:
    from hivejobs.embedded.servers import EmbeddedServers

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


class BackendUnavailable(ConfigError):
    """No usable Postgres/Redis: nothing configured, nothing local and embedded not allowed."""


@dataclass(frozen=True)
class Backends:
    """Which Postgres/Redis to use, and why (``source``)."""

    database_url: str
    redis_url: str
    source: Literal["explicit", "local", "embedded"]
    embedded: EmbeddedServers | None = None


def probe_local_postgres(url: str) -> str | None:
    """The default URL with a user that can log in to the ``postgres`` db, or None.

    Users tried: the URL's own, else ``PGUSER``, the current user, ``postgres``. Passwords
    come from libpq's own sources (PGPASSWORD, ~/.pgpass), never put into the URL.
    """
    parts = urlsplit(url)
    host, port = parts.hostname or HOST, parts.port or 5432
    if not tcp_open(host, port):
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


def env_flag(name: str) -> bool | None:
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
    flag = env_flag("HIVEJOBS_EMBEDDED")
    explicit = explicit_urls(database_url, redis_url)
    if explicit is not None:
        if flag:
            logger.warning("HIVEJOBS_EMBEDDED=1 ignored: explicit database and Redis URLs given")
        return Backends(*explicit, "explicit")
    db, rd = configured_urls(database_url, redis_url)
    if db or rd:
        if not db:
            db = probe_local_postgres(DEFAULT_DATABASE_URL)
        elif not redis_handshake(DEFAULT_REDIS_URL):
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
        local_db = probe_local_postgres(DEFAULT_DATABASE_URL)
        if local_db and redis_handshake(DEFAULT_REDIS_URL):
            # No password to redact: the defaults hold none, and the probe adds only a user
            # (libpq reads passwords from PGPASSWORD or ~/.pgpass, never from the URL).
            logger.info(
                "using the local Postgres and Redis",
                database=local_db,
                redis=DEFAULT_REDIS_URL,
            )
            return Backends(local_db, DEFAULT_REDIS_URL, "local")
    if flag is False:
        raise BackendUnavailable(
            "no backend configured: set HIVEJOBS_DATABASE_URL (postgresql://...) and"
            " HIVEJOBS_REDIS_URL (redis://...), or run Postgres on 127.0.0.1:5432 and Redis on"
            f" 127.0.0.1:6379, or unset HIVEJOBS_EMBEDDED=0 and {INSTALL_HINT} for embedded"
            " servers"
        )
    from hivejobs.embedded import servers as embedded
    from hivejobs.embedded.guard import EmbeddedError

    try:
        servers = embedded.start_embedded(data_dir)
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
