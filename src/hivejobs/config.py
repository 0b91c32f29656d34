"""Settings from the environment and keyword arguments, the default URLs and the one URL
precedence rule. The URLs themselves (checks, parsing, redaction, their passwords) are
urls.py's.

Never shows a password: the repr of Settings redacts both URLs, and every password a
Settings is given is remembered for scrub_known() (urls.py).
"""

from __future__ import annotations

import math
import os
import re
from typing import Annotated, Any, Literal

import msgspec

from hivejobs.errors import ConfigError
from hivejobs.urls import (
    check_database_url,
    check_redis_url,
    redact_url,
    remember_secrets,
    url_secrets,
)

# Where a process's URLs came from: "default" until resolved (no URL was given, so the local
# servers or embedded ones are chosen on first connection, backends.choose_backends).
BackendSource = Literal["default", "explicit", "local", "embedded"]

DEFAULT_PREFIX = "hivejobs:"
# fullmatch, not `$`: `$` also matches before a trailing newline.
PREFIX_RE = re.compile(r"[A-Za-z0-9_.\-:]{1,64}")
# Ten years: longer durations are typos (or inf); finite is part of "positive seconds".
_MAX_S = 10 * 366 * 24 * 3600.0
Seconds = Annotated[float, msgspec.Meta(gt=0, le=_MAX_S)]
Count = Annotated[int, msgspec.Meta(ge=1)]
# Room for an error's head, the truncation note and its tail.
MIN_RESULT_BYTES = 1024


# The URLs every process starts from; backends.choose_backends probes and falls back.
DEFAULT_DATABASE_URL = "postgresql://127.0.0.1:5432/hivejobs"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


def configured_urls(
    database_url: str | None = None, redis_url: str | None = None
) -> tuple[str | None, str | None]:
    """The one URL precedence rule: arguments, then HIVEJOBS_DATABASE_URL / HIVEJOBS_REDIS_URL,
    then DATABASE_URL / REDIS_URL (what Heroku-style platforms set). None when unset."""
    env = os.environ
    db = database_url or env.get("HIVEJOBS_DATABASE_URL") or env.get("DATABASE_URL")
    rd = redis_url or env.get("HIVEJOBS_REDIS_URL") or env.get("REDIS_URL")
    return db or None, rd or None


def explicit_urls(
    database_url: str | None = None, redis_url: str | None = None
) -> tuple[str, str] | None:
    """Both URLs when both are configured (then nothing is probed or started), else None."""
    db, rd = configured_urls(database_url, redis_url)
    return (db, rd) if db and rd else None


class Settings(msgspec.Struct, kw_only=True):
    """Runtime knobs. Durations are float seconds, finite and positive (msgspec checks them
    with the field's name); production defaults, tests shrink them."""

    database_url: str
    redis_url: str
    backend_source: BackendSource = "explicit"
    prefix: str = DEFAULT_PREFIX
    max_payload_bytes: Count = 1024 * 1024
    pop_block_s: Seconds = 1.0
    # What a handler returns or raises is stored, and read back by status and chains: an
    # encoded result above this fails its attempt, an error text is truncated to it.
    max_result_bytes: Annotated[int, msgspec.Meta(ge=MIN_RESULT_BYTES)] = 1024 * 1024
    # A paused Redis must not hang a thread for ever; longer than pop_block_s (rule R11 in
    # docs/concepts/reliability.md).
    redis_socket_timeout_s: Seconds = 5.0
    heartbeat_s: Seconds = 5.0
    stuck_after_s: Seconds = 30.0
    shutdown_timeout_s: Seconds = 25.0
    # Stragglers are told to stop this long before the shutdown deadline.
    stop_grace_s: Seconds = 3.0
    timeout_grace_s: Seconds = 5.0
    # An `async def` handler that holds its pool's event loop longer is reported (once per
    # job type, with where): it stalls every task of its process (worker/loopwatch.py).
    loop_blocked_after_s: Seconds = 0.1
    coordinator_interval_s: Seconds = 1.0
    promote_interval_s: Seconds = 0.2
    lease_ttl_s: Seconds = 15.0
    lease_renew_s: Seconds = 5.0
    lease_margin_s: Seconds = 1.0
    poison_pill_after: Count = 3
    archive_retention_s: Seconds = 7 * 24 * 3600.0
    # `stop_chain` gives up on tries that ignore ctx.stopping after this long (spincycle).
    chain_stop_timeout_s: Seconds = 30.0
    # Captured stdout and stderr kept per chain try and stream (the job log); the tail wins.
    job_log_output_bytes: Count = 64 * 1024
    # A drained hot table (a few live rows) bigger than this is vacuumed and reindexed; 0 off.
    compact_above_bytes: Annotated[float, msgspec.Meta(ge=0, le=2.0**62)] = 16 * 1024 * 1024
    # Postgres is reached through a transaction-mode pooler (PgBouncer): no startup options,
    # no prepared statements, session settings per transaction (docs/scaling.md).
    pgbouncer: bool = False
    # A direct (not pooled) URL for the coordinator's LISTEN; empty: database_url.
    listen_database_url: str = ""
    # Listings and dashboards (status, workers, chain lists) read here, e.g. a replica;
    # empty: database_url. Never used for a read that decides a write.
    read_database_url: str = ""
    # `hivejobs serve`'s public /healthz and `hivejobs run --metrics-port`'s /metrics reuse
    # their answer this long: a flood of probes costs one Postgres round trip per interval.
    probe_cache_s: Seconds = 2.0

    def __post_init__(self) -> None:
        if not isinstance(self.prefix, str) or not PREFIX_RE.fullmatch(self.prefix):
            raise ConfigError(
                f"redis prefix {self.prefix!r} must be 1-64 characters of letters, digits, _.-:"
            )
        # msgspec.convert checks the Meta constraints; a Settings(...) built directly does not.
        for name in self.__struct_fields__:
            if name.endswith("_s"):
                positive_seconds(name, getattr(self, name))
        for name in ("max_payload_bytes", "poison_pill_after"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be positive")
        if self.redis_socket_timeout_s <= self.pop_block_s:
            raise ConfigError("redis_socket_timeout_s must exceed pop_block_s (a paused Redis)")
        check_database_url(self.database_url)
        check_redis_url(self.redis_url)
        for extra in (self.listen_database_url, self.read_database_url):
            if extra:
                check_database_url(extra)
                remember_secrets(extra)
        remember_secrets(self.database_url, self.redis_url)

    def __repr__(self) -> str:
        shown = ", ".join(
            f"{name}={redact_url(value) if name.endswith('_url') else value!r}"
            for name in self.__struct_fields__
            if (value := getattr(self, name)) is not None
        )
        return f"Settings({shown})"

    __str__ = __repr__

    def secrets(self) -> list[str]:
        """The passwords in both URLs, for scrub()."""
        return url_secrets(self.database_url) + url_secrets(self.redis_url)


def settings_from_env(
    database_url: str | None = None,
    redis_url: str | None = None,
    prefix: str | None = None,
    **overrides: float | int | str,
) -> Settings:
    """Arguments win over HIVEJOBS_* variables, which win over DATABASE_URL/REDIS_URL."""
    db, rd = configured_urls(database_url, redis_url)
    if prefix is None:
        prefix = os.environ.get("HIVEJOBS_PREFIX")
    raw: dict[str, Any] = {}
    for field in Settings.__struct_fields__:
        if field in ("database_url", "redis_url", "prefix", "backend_source"):
            continue
        value = os.environ.get("HIVEJOBS_" + field.upper())
        if value is not None and value.strip() != "":
            raw[field] = value.strip()
    unknown = sorted(set(overrides) - set(Settings.__struct_fields__))
    if unknown:
        raise ConfigError(f"unknown setting {unknown[0]!r}")
    raw.update(overrides)
    raw.update(
        database_url=db or DEFAULT_DATABASE_URL,
        redis_url=rd or DEFAULT_REDIS_URL,
        backend_source="explicit" if explicit_urls(db, rd) else "default",
        # An empty prefix is refused, never silently replaced by the default.
        prefix=DEFAULT_PREFIX if prefix is None else prefix,
    )
    try:
        return msgspec.convert(raw, Settings, strict=False)
    except msgspec.ValidationError as exc:
        raise ConfigError(_setting_error(str(exc), raw)) from None


def _setting_error(detail: str, raw: dict[str, Any]) -> str:
    """msgspec's ``Expected `float` > 0.0 - at `$.heartbeat_s` `` as the variable's name."""
    match = re.search(r"at `\$\.(\w+)`", detail)
    if not match:
        return detail
    field = match.group(1)
    what = detail.split(" - at ", 1)[0]
    var = "HIVEJOBS_" + field.upper()
    source = f"{var}={os.environ[var]!r}" if var in os.environ else f"{field}={raw.get(field)!r}"
    if field.endswith("_s"):
        return f"{source} must be a finite number of seconds > 0 ({what})"
    return f"{source} is invalid ({what})"


def positive_seconds(label: str, value: float) -> float:
    """For durations that arrive outside Settings (CLI options): finite and positive."""
    if not (isinstance(value, int | float) and math.isfinite(value) and 0 < value <= _MAX_S):
        raise ConfigError(f"{label} must be a finite positive number of seconds, not {value!r}")
    return float(value)
