"""Who may do what: bearer tokens (read-only, admin and callback), dashboard sessions, and the
back-off of clients that keep presenting wrong tokens.

A callback token belongs to one job type (HIVEJOBS_CALLBACK_TOKENS="type:token,..."): the
service that reports a callback job's outcome may post that type's status callbacks and
nothing else (no reading, enqueueing, cancelling, replaying, pausing or scaling, no dashboard
session). A type with a callback secret (HIVEJOBS_CALLBACK_SECRETS="type:secret,...") also
needs the body's HMAC-SHA256 in `X-Hivejobs-Signature: sha256=<hex>`, whoever posts it.

An API client sends `Authorization: Bearer <token>`. A browser signs in once at
/dashboard/login and then carries a session cookie: the role and an expiry signed with a
secret made when the server starts (the token itself is never put in a cookie, so a stolen
cookie dies with its expiry or the process, and a logout drops it). No token configured means
open access, which `hivejobs serve` allows only on a loopback address and create_app only
when asked (`allow_open=True`). Never logs a token, only the client's address.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import math
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, Literal

import msgspec
from litestar.connection import ASGIConnection
from litestar.exceptions import TooManyRequestsException
from loguru import logger

from hivejobs.errors import ConfigError
from hivejobs.jobtypes import NAME_RE

Role = Literal["read", "admin", "callback"]
SIGNATURE_HEADER = "X-Hivejobs-Signature"
SESSION_COOKIE = "hivejobs_session"
SESSION_S = 12 * 3600.0
# Shorter tokens can be guessed online even at the back-off's pace; 20 URL-safe characters
# are 120 bits.
MIN_TOKEN_CHARS = 20


class Tokens(msgspec.Struct, frozen=True, kw_only=True):
    read: tuple[str, ...] = ()
    admin: tuple[str, ...] = ()
    callback: tuple[tuple[str, str], ...] = ()  # (job type, token)
    secrets: tuple[tuple[str, str], ...] = ()  # (job type, HMAC key of its callback bodies)

    @property
    def open(self) -> bool:
        """No token configured: everyone who can connect is admin."""
        return not self.read and not self.admin

    def role_of(self, presented: str | None) -> Role | None:
        """The role a presented token grants; every configured token is compared (constant
        time each, and no early exit), so timing tells nothing about which one nearly matched."""
        if self.open:
            return "admin"
        if not presented:
            return None
        given = presented.encode()
        admin = False
        read = False
        for token in self.admin:
            admin |= hmac.compare_digest(given, token.encode())
        for token in self.read:
            read |= hmac.compare_digest(given, token.encode())
        callback = bool(self.callback_types(presented))
        return "admin" if admin else ("read" if read else ("callback" if callback else None))

    def callback_types(self, presented: str) -> frozenset[str]:
        """The job types whose callbacks `presented` may post (every token compared)."""
        given = presented.encode()
        return frozenset(
            [name for name, token in self.callback if hmac.compare_digest(given, token.encode())]
        )

    def signature_ok(self, name: str, body: bytes, header: str | None) -> bool:
        """True when `name` has no callback secret, or `header` carries the body's HMAC."""
        keys = [secret for job_type, secret in self.secrets if job_type == name]
        if not keys:
            return True
        given = (header or "").strip()
        ok = False
        for key in keys:
            mac = hmac.new(key.encode(), body, hashlib.sha256).hexdigest()
            ok |= hmac.compare_digest(given.encode(), f"sha256={mac}".encode())
        return ok


def check_tokens(tokens: Sequence[str], name: str) -> tuple[str, ...]:
    """The tokens, or a ConfigError naming `name` (the variable or argument they came from)
    when one is too short to resist guessing."""
    for token in tokens:
        if len(token) < MIN_TOKEN_CHARS:
            raise ConfigError(
                f"{name}: a token of {len(token)} characters is too short to resist guessing; "
                f"use at least {MIN_TOKEN_CHARS}, e.g. "
                '`python3 -c "import secrets; print(secrets.token_urlsafe(32))"`'
            )
    return tuple(tokens)


def parse_tokens(raw: str | None) -> tuple[str, ...]:
    """Comma-separated tokens; blanks dropped."""
    return tuple(t.strip() for t in (raw or "").split(",") if t.strip())


def parse_typed(raw: str | None, variable: str) -> tuple[tuple[str, str], ...]:
    """`type:value,...` (HIVEJOBS_CALLBACK_TOKENS, HIVEJOBS_CALLBACK_SECRETS); blanks dropped,
    each value at least MIN_TOKEN_CHARS long (check_tokens)."""
    pairs = []
    for item in parse_tokens(raw):
        name, sep, value = item.partition(":")
        if not sep or not NAME_RE.fullmatch(name.strip()) or not value.strip():
            raise ConfigError(f"{variable}: each item must be JOB_TYPE:VALUE, comma-separated")
        pairs.append((name.strip(), value.strip()))
    check_tokens([value for _, value in pairs], variable)
    return tuple(pairs)


def bearer(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


class Sessions:
    """Signs and checks dashboard session cookies: `role.expiry.nonce.mac`, the MAC an
    HMAC-SHA256 under a secret of this process. Owns only the secret (immutable)."""

    def __init__(self, secret: bytes | None = None, lifetime_s: float = SESSION_S) -> None:
        self._secret = secret or secrets.token_bytes(32)
        self.lifetime_s = lifetime_s

    def issue(self, role: Role, now: float | None = None) -> str:
        expires = int((time.time() if now is None else now) + self.lifetime_s)
        body = f"{role}.{expires}.{secrets.token_urlsafe(12)}"
        return f"{body}.{self._mac(body)}"

    def role_of(self, cookie: str | None, now: float | None = None) -> Role | None:
        """The role of a valid, unexpired session; None for anything else."""
        if not cookie or cookie.count(".") != 3:
            return None
        body, _, mac = cookie.rpartition(".")
        if not hmac.compare_digest(mac.encode(), self._mac(body).encode()):
            return None
        role, expires, _ = body.split(".")
        if not expires.isdigit() or int(expires) <= (time.time() if now is None else now):
            return None
        if role == "admin":
            return "admin"
        return "read" if role == "read" else None

    def _mac(self, body: str) -> str:
        return hmac.new(self._secret, body.encode(), "sha256").hexdigest()


class _Record(msgspec.Struct):
    first_s: float
    failures: int
    blocked_until_s: float = 0.0


class Throttle:
    """Per-client back-off after wrong tokens: `max_failures` within `window_s` block the
    client for `block_s` (answered 429 with Retry-After, its tokens not even compared).

    Owns `_clients` (address, an IPv6 one by its /64 -> record, least recently failed
    first), guarded by `_lock` (the guard runs on the event loop, the login form in a
    thread). Memory is bounded: beyond `max_clients` the oldest record is dropped, which can
    only shorten a block; with at least 20-character tokens, guesses stay hopeless."""

    def __init__(
        self,
        *,
        max_failures: int = 10,
        window_s: float = 60.0,
        block_s: float = 60.0,
        max_clients: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_failures = max_failures
        self.window_s = window_s
        self.block_s = block_s
        self.max_clients = max_clients
        self._clock = clock
        self._clients: OrderedDict[str, _Record] = OrderedDict()
        self._lock = threading.Lock()

    def retry_after(self, client: str) -> int | None:
        """Seconds until `client` may try again, or None when it is not blocked."""
        with self._lock:
            record = self._clients.get(_key(client))
            left = record.blocked_until_s - self._clock() if record else 0.0
        return math.ceil(left) if left > 0 else None

    def failed(self, client: str) -> bool:
        """Count a failure; True when this one blocks the client."""
        now = self._clock()
        client = _key(client)
        with self._lock:
            record = self._clients.pop(client, None)
            if record is None or now - record.first_s > self.window_s:
                record = _Record(first_s=now, failures=0)
            record.failures += 1
            blocks = record.failures >= self.max_failures and record.blocked_until_s <= now
            if blocks:
                record.blocked_until_s = now + self.block_s
                record.first_s, record.failures = now + self.block_s, 0
            self._clients[client] = record
            while len(self._clients) > self.max_clients:
                self._clients.popitem(last=False)
        return blocks

    def __len__(self) -> int:
        return len(self._clients)


def _key(client: str) -> str:
    """An IPv6 client is its /64: one host usually holds the whole prefix and could guess
    from a new address each time."""
    try:
        address = ipaddress.ip_address(client)
    except ValueError:
        return client
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return str(address)


def check_throttle(throttle: Throttle, client: str) -> None:
    """429 for a client blocked after wrong tokens; its token is not even compared."""
    wait = throttle.retry_after(client)
    if wait is not None:
        raise TooManyRequestsException(
            f"too many wrong tokens from this address: retry in {wait} s",
            headers={"Retry-After": str(wait)},
        )


def failed_authentication(throttle: Throttle, client: str, path: str) -> None:
    """Logs a wrong token (never the token: the client's address and the path) and counts
    it; at most `max_failures` lines per client and window, then one for the block."""
    logger.warning("authentication failed: wrong token", client=client, path=path)
    if throttle.failed(client):
        logger.warning(
            "client blocked after repeated wrong tokens",
            client=client,
            block_s=throttle.block_s,
            failures=throttle.max_failures,
        )


def client_address(connection: ASGIConnection[Any, Any, Any, Any]) -> str:
    return connection.client.host if connection.client else "unknown"
