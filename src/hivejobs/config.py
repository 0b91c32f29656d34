"""Settings from the environment and keyword arguments; DSN redaction and secret scrubbing.

Never logs or prints a URL that has not been through redact_url(), and never shows a
password: the repr of Settings hides both URLs' passwords, and scrub() removes every
password we were given from any text (error messages, log lines) before it is shown.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
from collections.abc import Callable
from typing import Annotated, Any, cast
from urllib.parse import quote, unquote, urlencode, urlsplit, urlunsplit

import msgspec
from loguru import logger
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from redis.connection import parse_url as _redis_parse_url

from hivejobs.errors import ConfigError

DEFAULT_PREFIX = "hivejobs:"
# fullmatch, not `$`: `$` also matches before a trailing newline.
PREFIX_RE = re.compile(r"[A-Za-z0-9_.\-:]{1,64}")
# redis(s)+sentinel://host:port,host:port/mastername and redis(s)+cluster://host:port,...
# are opened by broker/clients.py with redis-py's Sentinel and RedisCluster.
REDIS_SCHEMES: tuple[str, ...] = ("redis", "rediss", "unix", "redis+sentinel", "rediss+sentinel")
REDIS_SCHEMES += ("redis+cluster", "rediss+cluster")
POSTGRES_SCHEMES = ("postgresql", "postgres")
# Conninfo keys whose value is a secret (libpq's "password" and the SSL key's passphrase).
_SECRET_KEYS = ("password", "sslpassword")
_PORT_RE = re.compile(r"\d*(,\d*)*")
# Ten years: longer durations are typos (or inf); finite is part of "positive seconds".
_MAX_S = 10 * 366 * 24 * 3600.0
Seconds = Annotated[float, msgspec.Meta(gt=0, le=_MAX_S)]
Count = Annotated[int, msgspec.Meta(ge=1)]
# redis-py's own URL parser (what Redis.from_url uses), typed.
_redis_py_parse_url = cast(Callable[[str], dict[str, Any]], _redis_parse_url)
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
    # "default" until resolved: no URL was given, so the local servers or embedded ones are
    # chosen on first connection (backends.choose_backends).
    backend_source: str = "explicit"
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


# --------------------------------------------------------------------------- URLs


def is_redis_url(url: str) -> bool:
    return url.split("://", 1)[0].lower() in REDIS_SCHEMES and "://" in url


def check_database_url(url: str) -> dict[str, str]:
    """libpq's own parse of a URL or key=value DSN; refused (without echoing it) if malformed."""
    if not isinstance(url, str):
        raise ConfigError("the database URL must be a string")
    scheme = url.split("://", 1)[0].lower() if "://" in url else None
    if scheme is not None and scheme not in POSTGRES_SCHEMES:
        raise ConfigError(f"URL {redact_url(url)!r} should start with postgresql://")
    try:
        params = conninfo_to_dict(url)
    except Exception:  # psycopg.ProgrammingError; its text repeats the DSN
        raise ConfigError(
            "the database URL is malformed (expected postgresql://user:password@host:port/db "
            "or key=value pairs)"
        ) from None
    host = str(params.get("host", ""))
    if not _PORT_RE.fullmatch(str(params.get("port", ""))) or "@" in host:
        # libpq read part of the password as the host or port: a '#', '/', '?' or '@' in it.
        raise ConfigError(
            "the database URL is malformed: percent-encode special characters in the password "
            "('#' as %23, '/' as %2F, '@' as %40, '?' as %3F, ':' as %3A)"
        )
    return {k: str(v) for k, v in params.items() if v is not None}


def check_redis_url(url: str) -> None:
    if not isinstance(url, str) or not is_redis_url(url):
        shown = redact_url(url) if isinstance(url, str) else type(url).__name__
        raise ConfigError(f"URL {shown!r} should start with redis://")
    try:
        parse_redis_url(url)
    except (ValueError, TypeError):
        raise ConfigError(
            "the Redis URL is malformed: percent-encode special characters in the password "
            "('#' as %23, '/' as %2F, '@' as %40, '?' as %3F, ':' as %3A)"
        ) from None


def url_secrets(url: str) -> list[str]:
    """Every password in a Postgres or Redis URL (query forms included), raw and decoded."""
    found: list[str] = []
    try:
        if is_redis_url(url):
            found += [str(parse_redis_url(url).params.get("password") or "")]
        else:
            params = conninfo_to_dict(url)
            found += [str(params.get(key) or "") for key in _SECRET_KEYS]
    except Exception:  # unparseable: fall back to the userinfo's text below
        pass
    userinfo = url.split("://", 1)[-1].rsplit("@", 1)
    if len(userinfo) == 2 and ":" in userinfo[0]:
        found.append(userinfo[0].split(":", 1)[1])
    for match in re.finditer(r"(?:^|[?&\s])(?:ssl)?password=([^&\s]*)", url):
        found.append(match.group(1))
    out: list[str] = []
    for secret in found:
        for form in (secret, unquote(secret), quote(secret, safe="")):
            if len(form) >= 3 and form not in out:
                out.append(form)
    return sorted(out, key=len, reverse=True)


def scrub(text: str, secrets: list[str]) -> str:
    """Replace every secret in text by ***; the last defence for messages we did not write."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text


# Every password this process was given (settings, embedded servers): scrub_known() removes
# them from log lines and CLI errors. Only grows; guarded by the GIL (append, read).
_KNOWN_SECRETS: list[str] = []


def remember_secrets(*urls: str) -> None:
    for url in urls:
        for secret in url_secrets(url):
            if secret not in _KNOWN_SECRETS:
                _KNOWN_SECRETS.append(secret)
    _KNOWN_SECRETS.sort(key=len, reverse=True)


def scrub_known(text: str) -> str:
    return scrub(text, _KNOWN_SECRETS) if _KNOWN_SECRETS else text


def known_secrets() -> tuple[str, ...]:
    """The passwords scrub_known() removes, longest first."""
    return tuple(_KNOWN_SECRETS)


# sslmode values under which libpq may talk plain text, or trusts any certificate offered.
_UNVERIFIED_SSLMODES = frozenset({"disable", "allow", "prefer"})
_WARNED_TLS: set[str] = set()


def postgres_tls_warning(url: str) -> str | None:
    """Why a connection to `url` is not protected by TLS, or None: a host off this machine
    with no sslmode (libpq's default `prefer` falls back to plain text, and checks no
    certificate) or disable/allow/prefer. A Unix socket or a loopback address is fine."""
    try:
        params = conninfo_to_dict(url)
    except Exception:  # unparseable: check_database_url says so elsewhere
        return None
    hosts = [h for h in str(params.get("host") or "").split(",") if h]
    hosts += [h for h in str(params.get("hostaddr") or "").split(",") if h]
    remote = [h for h in hosts if not h.startswith("/") and not _is_loopback_name(h)]
    if not remote:
        return None
    mode = str(params.get("sslmode") or os.environ.get("PGSSLMODE") or "prefer")
    if mode not in _UNVERIFIED_SSLMODES:
        return None
    return (
        f"Postgres at {remote[0]} is reached with sslmode={mode}: passwords and jobs may cross "
        "the network in plain text; add sslmode=verify-full (or require) to the database URL"
    )


def warn_plaintext_postgres(url: str) -> None:
    """postgres_tls_warning as a log line, once per process and URL."""
    warning = postgres_tls_warning(url)
    if warning is not None and url not in _WARNED_TLS:
        _WARNED_TLS.add(url)
        logger.warning("Postgres connection without TLS guarantees", detail=warning)


def _is_loopback_name(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def with_database(url: str, dbname: str) -> str:
    """The same server (URL or key=value DSN) naming another database; options kept."""
    return make_conninfo(url, dbname=dbname)


def redact_url(url: str) -> str:
    """A Postgres or Redis URL (or key=value DSN) fit to log: every password is ***."""
    try:
        if is_redis_url(url):
            shown = _redact_redis(url)
        elif "://" not in url or url.split("://", 1)[0].lower() in POSTGRES_SCHEMES:
            shown = _redact_postgres(url)
        else:  # another scheme, refused by the checks: hide its userinfo's password
            parts = urlsplit(url)
            netloc = parts.netloc.rsplit("@", 1)
            if len(netloc) == 2:
                user = netloc[0].split(":", 1)[0]
                parts = parts._replace(netloc=f"{user}:***@{netloc[1]}")
            shown = urlunsplit(parts)
    except Exception:  # whatever the parsers raise, show nothing of it
        return "<malformed URL>"
    return scrub(shown, url_secrets(url))


def _redact_postgres(url: str) -> str:
    params = check_database_url(url)
    for key in _SECRET_KEYS:
        if key in params:
            params[key] = "***"
    if "://" not in url:
        return make_conninfo("", **params)
    user, password = params.pop("user", ""), params.pop("password", None)
    host, port, dbname = params.pop("host", ""), params.pop("port", ""), params.pop("dbname", "")
    userinfo = quote(user, safe="") + (":***" if password is not None else "")
    netloc = (userinfo + "@" if userinfo else "") + ("" if "/" in host else host)
    if "/" in host:  # a unix socket directory goes in the query, as libpq reads it
        params["host"] = host
    if port and "," not in port:
        netloc += f":{port}"
    elif port:
        params["port"] = port
    query = "?" + urlencode(params, safe="*/,") if params else ""
    return f"postgresql://{netloc}/{quote(dbname, safe='')}{query}"


class RedisUrl(msgspec.Struct, frozen=True, kw_only=True):
    """A Redis URL taken apart: what broker/clients.py opens and what redact_url() shows.
    The hosts of a +sentinel / +cluster URL and a sentinel's master name are ours to read;
    the rest (user, password, db, query) is redis-py's, read as for the first host alone."""

    base: str  # redis, rediss or unix (lower case; anything else is the caller's to refuse)
    kind: str  # "" for one server, else what follows the "+": sentinel, cluster
    hosts: list[str]  # a +kind URL's host:port items as written (empty for one server)
    service: str  # a sentinel's master name (the first path segment), "" otherwise
    params: dict[str, Any]  # redis-py's parse_url of the URL as one server's


def parse_redis_url(url: str) -> RedisUrl:
    """The one parser of our Redis URLs; raises ValueError or TypeError (from redis-py) on a
    malformed one and checks nothing else: a host without a port, a sentinel URL without its
    master, are the broker client's to refuse (redaction shows them as they are)."""
    scheme, _, rest = url.partition("://")
    base, plus, kind = scheme.lower().partition("+")
    if not plus:
        return RedisUrl(base=base, kind="", hosts=[], service="", params=_redis_py_parse_url(url))
    cut = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    netloc, tail = rest[:cut], rest[cut:]
    creds, at, hosts = netloc.rpartition("@")
    path, mark, query = tail.partition("?")
    segments = [s for s in path.split("/") if s]
    service = unquote(segments.pop(0)) if kind == "sentinel" and segments else ""
    first = hosts.split(",")[0]
    one = f"{base}://{creds}{at}{first}/{'/'.join(segments)}{mark}{query}"
    return RedisUrl(
        base=base,
        kind=kind,
        hosts=[h for h in hosts.split(",") if h],
        service=service,
        params=_redis_py_parse_url(one),
    )


def _redact_redis(url: str) -> str:
    parts = parse_redis_url(url).params
    scheme = url.split("://", 1)[0].lower()
    user = str(parts.get("username") or "")
    userinfo = quote(user, safe="") + (":***" if parts.get("password") else "")
    at = userinfo + "@" if userinfo else ""
    if "+" in scheme:  # the hosts as given, and a sentinel's master name
        rest = url.split("://", 1)[1].split("?", 1)[0]
        return f"{scheme}://{at}{rest.rsplit('@', 1)[-1]}"
    if scheme == "unix":
        db = parts.get("db")
        return f"unix://{at}{parts.get('path', '')}" + (f"?db={db}" if db is not None else "")
    host, port, db = parts.get("host", ""), parts.get("port"), parts.get("db")
    tail = (f":{port}" if port else "") + (f"/{db}" if db is not None else "")
    return f"{scheme}://{at}{host}{tail}"
