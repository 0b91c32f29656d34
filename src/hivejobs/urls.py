"""Postgres and Redis URLs: their checks, the one Redis URL parser, redaction for logs and
errors, the passwords they carry and the scrubbing of those from any text we show, and the
warning for a Postgres reached without TLS guarantees.

Never logs or prints a URL that has not been through redact_url(), and never shows a
password: scrub() removes every password we were given from any text (error messages, log
lines) before it is shown. Imports nothing of ours but errors.py (config.py builds on it).
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Callable
from typing import Any, cast
from urllib.parse import quote, unquote, urlencode, urlsplit, urlunsplit

import msgspec
from loguru import logger
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from redis.connection import parse_url as _redis_parse_url

from hivejobs.errors import ConfigError

# redis(s)+sentinel://host:port,host:port/mastername and redis(s)+cluster://host:port,...
# are opened by broker/clients.py with redis-py's Sentinel and RedisCluster.
REDIS_SCHEMES: tuple[str, ...] = ("redis", "rediss", "unix", "redis+sentinel", "rediss+sentinel")
REDIS_SCHEMES += ("redis+cluster", "rediss+cluster")
POSTGRES_SCHEMES = ("postgresql", "postgres")
# Conninfo keys whose value is a secret (libpq's "password" and the SSL key's passphrase).
_SECRET_KEYS = ("password", "sslpassword")
_PORT_RE = re.compile(r"\d*(,\d*)*")
# redis-py's own URL parser (what Redis.from_url uses), typed.
_redis_py_parse_url = cast(Callable[[str], dict[str, Any]], _redis_parse_url)


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
