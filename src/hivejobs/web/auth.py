"""Bearer tokens: read-only and admin, from configuration, compared in constant time.

A request carries `Authorization: Bearer <token>`, or (the dashboard in a browser) the
`hivejobs_token` cookie set by the login form: HttpOnly and SameSite=Strict, so another site
cannot make a browser send it with a forged POST. No token configured means open access, which
`hivejobs serve` allows only on a loopback address.
"""

from __future__ import annotations

import hmac
from typing import Literal

import msgspec

Role = Literal["read", "admin"]
COOKIE = "hivejobs_token"


class Tokens(msgspec.Struct, frozen=True, kw_only=True):
    read: tuple[str, ...] = ()
    admin: tuple[str, ...] = ()

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
        return "admin" if admin else ("read" if read else None)


def parse_tokens(raw: str | None) -> tuple[str, ...]:
    """Comma-separated tokens; blanks dropped."""
    return tuple(t.strip() for t in (raw or "").split(",") if t.strip())


def bearer(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None
