"""Settings from the environment and keyword arguments, and URL redaction.

Never logs or prints a URL that has not been through redact_url().
"""

from __future__ import annotations

import os
import re
from urllib.parse import urlsplit, urlunsplit

import msgspec

from hivejobs.errors import ConfigError

DEFAULT_DATABASE_URL = "postgresql://127.0.0.1:5432/hivejobs"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
PREFIX_RE = re.compile(r"^[A-Za-z0-9_.\-:]{1,64}$")
# redis(s)+sentinel://host:port,host:port/mastername and redis(s)+cluster://host:port,...
# are opened by broker_client.py with redis-py's Sentinel and RedisCluster.
REDIS_SCHEMES: tuple[str, ...] = ("redis", "rediss", "unix")
REDIS_SCHEMES += ("redis+sentinel", "rediss+sentinel", "redis+cluster", "rediss+cluster")


class Settings(msgspec.Struct, kw_only=True):
    """Runtime knobs. Durations are float seconds; production defaults, tests shrink them."""

    database_url: str
    redis_url: str
    # "default" until resolved: no URL was given, so the local servers or embedded ones are
    # chosen on first connection (embedded.choose_backends).
    backend_source: str = "explicit"
    prefix: str = "hivejobs:"
    max_payload_bytes: int = 1024 * 1024
    pop_block_s: float = 1.0
    # R11: a paused Redis must not hang a thread for ever; longer than pop_block_s.
    redis_socket_timeout_s: float = 5.0
    heartbeat_s: float = 5.0
    stuck_after_s: float = 30.0
    shutdown_timeout_s: float = 25.0
    # Stragglers are told to stop this long before the shutdown deadline.
    stop_grace_s: float = 3.0
    timeout_grace_s: float = 5.0
    coordinator_interval_s: float = 1.0
    promote_interval_s: float = 0.2
    lease_ttl_s: float = 15.0
    lease_renew_s: float = 5.0
    lease_margin_s: float = 1.0
    poison_pill_after: int = 3
    archive_retention_s: float = 7 * 24 * 3600.0
    # A drained hot table (a few live rows) bigger than this is vacuumed and reindexed.
    compact_above_bytes: float = 16 * 1024 * 1024
    # Postgres is reached through a transaction-mode pooler (PgBouncer): no startup options,
    # no prepared statements, session settings per transaction (docs/scaling.md).
    pgbouncer: bool = False
    # A direct (not pooled) URL for the coordinator's LISTEN; empty: database_url.
    listen_database_url: str = ""
    # Listings and dashboards (status, workers, chain lists) read here, e.g. a replica;
    # empty: database_url. Never used for a read that decides a write.
    read_database_url: str = ""

    def __post_init__(self) -> None:
        if not PREFIX_RE.match(self.prefix):
            raise ConfigError(
                f"redis prefix {self.prefix!r} must be 1-64 characters of letters, digits, _.-:"
            )
        if self.redis_socket_timeout_s <= self.pop_block_s:
            raise ConfigError("redis_socket_timeout_s must exceed pop_block_s (a paused Redis)")
        if self.max_payload_bytes <= 0:
            raise ConfigError("max_payload_bytes must be positive")
        for url, schemes in (
            (self.database_url, ("postgresql", "postgres")),
            (self.redis_url, REDIS_SCHEMES),
        ):
            scheme = urlsplit(url).scheme
            if scheme not in schemes:
                raise ConfigError(f"URL {redact_url(url)!r} should start with {schemes[0]}://")


def env_float(name: str) -> float | None:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return None
    try:
        return float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number of seconds") from None


def settings_from_env(
    database_url: str | None = None,
    redis_url: str | None = None,
    prefix: str | None = None,
    **overrides: float | int | str,
) -> Settings:
    """Arguments win over HIVEJOBS_* variables, which win over DATABASE_URL/REDIS_URL."""
    db = database_url or os.environ.get("HIVEJOBS_DATABASE_URL") or os.environ.get("DATABASE_URL")
    rd = redis_url or os.environ.get("HIVEJOBS_REDIS_URL") or os.environ.get("REDIS_URL")
    source = "explicit" if db and rd else "default"
    kwargs: dict[str, float | int | str] = {}
    for field in Settings.__struct_fields__:
        if field in ("database_url", "redis_url", "prefix", *_BACKEND_FIELDS):
            continue
        value = env_float("HIVEJOBS_" + field.upper())
        if value is not None:
            kwargs[field] = int(value) if field in _INT_FIELDS else value
    kwargs.update(overrides)
    kwargs = {**backend_settings_from_env(), **kwargs}
    try:
        return Settings(
            database_url=db or DEFAULT_DATABASE_URL,
            redis_url=rd or DEFAULT_REDIS_URL,
            backend_source=source,
            prefix=prefix or os.environ.get("HIVEJOBS_PREFIX") or "hivejobs:",
            **kwargs,  # type: ignore[arg-type]
        )
    except TypeError as exc:
        raise ConfigError(str(exc)) from None


_INT_FIELDS = {"max_payload_bytes", "poison_pill_after"}
_BACKEND_FIELDS = ("pgbouncer", "listen_database_url", "read_database_url")


def backend_settings_from_env() -> dict[str, bool | str]:
    """HIVEJOBS_PGBOUNCER (1/true/yes), HIVEJOBS_LISTEN_DATABASE_URL and
    HIVEJOBS_READ_DATABASE_URL, when set."""
    found: dict[str, bool | str] = {}
    flag = os.environ.get("HIVEJOBS_PGBOUNCER", "").strip().lower()
    if flag:
        if flag not in ("1", "true", "yes", "0", "false", "no"):
            raise ConfigError(f"HIVEJOBS_PGBOUNCER={flag!r} should be 1 or 0")
        found["pgbouncer"] = flag in ("1", "true", "yes")
    for field in ("listen_database_url", "read_database_url"):
        url = os.environ.get("HIVEJOBS_" + field.upper(), "")
        if url:
            found[field] = url
    return found


def with_database(url: str, dbname: str) -> str:
    """The same server URL naming another database (query options kept)."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + dbname))


def redact_url(url: str) -> str:
    """Hide the password of a URL so that it can be logged or shown in an error."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable url>"
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))
