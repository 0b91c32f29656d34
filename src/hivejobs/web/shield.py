"""What keeps web pages from driving the server through the operator's browser: the allowed
Host names (DNS rebinding), the same-origin rule for every request that changes something
(CSRF, in open and token mode alike), JSON bodies only on JSON routes (a cross-site form can
send `text/plain` but never `application/json`), and the headers on every response (no
framing, no sniffing, no referrer, a CSP that runs only the dashboard's own script).

Pure checks over headers: each returns the refusal's status and message, or None. Non-browser
clients (curl, the SDKs) send neither Origin nor Sec-Fetch-Site and are not affected.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
from collections.abc import Iterable
from urllib.parse import urlsplit

from hivejobs.web.render import SCRIPT

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
LOOPBACK_NAMES = ("localhost", ".localhost")

_SCRIPT_HASH = base64.b64encode(hashlib.sha256(SCRIPT.encode()).digest()).decode()
CSP = (
    "default-src 'none'; "
    f"script-src 'sha256-{_SCRIPT_HASH}'; "
    # The state badges carry their colour in a style attribute; every value in them is ours.
    "style-src 'unsafe-inline'; "
    "img-src 'self'; connect-src 'self'; form-action 'self'; base-uri 'none'; "
    "frame-ancestors 'none'"
)
HEADERS: tuple[tuple[bytes, bytes], ...] = tuple(
    (k.encode(), v.encode())
    for k, v in (
        ("content-security-policy", CSP),
        ("x-frame-options", "DENY"),
        ("x-content-type-options", "nosniff"),
        ("referrer-policy", "no-referrer"),
        ("cross-origin-resource-policy", "same-origin"),
        ("cross-origin-opener-policy", "same-origin"),
    )
)


def host_name(host_header: str) -> str:
    """The name of a Host header, without port, brackets or a trailing dot, lower-cased."""
    host = host_header.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    if host.count(":") == 1:
        host = host.partition(":")[0]
    return host.rstrip(".")


def is_loopback_name(name: str) -> bool:
    if name == "localhost" or name.endswith(".localhost"):
        return True  # browsers resolve these to loopback themselves (no DNS to rebind)
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def allowed_hosts(configured: Iterable[str], open_mode: bool) -> tuple[str, ...] | None:
    """The Host names to accept (a leading dot: that domain and its subdomains), or None for
    any. Open mode always checks (loopback names plus the configured ones): a page that
    rebinds its own name to 127.0.0.1 must not reach an admin without a token. Token mode
    checks only when names are configured: a rebound page has no token to send."""
    names = tuple(host_name(h) if not h.startswith(".") else h.lower() for h in configured)
    if open_mode:
        return (*LOOPBACK_NAMES, *names)
    return names or None


def refuse_host(host_header: str | None, allowed: tuple[str, ...] | None) -> str | None:
    if allowed is None or host_header is None:
        return None  # no Host (HTTP/1.0): not a browser, which always sends one
    name = host_name(host_header)
    if is_loopback_name(name):
        return None
    for entry in allowed:
        if name == entry or (entry.startswith(".") and ("." + name).endswith(entry)):
            return None
    return (
        f"host {name!r} is not allowed: add it to HIVEJOBS_ALLOWED_HOSTS "
        "(create_app(allowed_hosts=...))"
    )


def refuse_cross_site(
    method: str, host_header: str | None, origin: str | None, fetch_site: str | None
) -> str | None:
    """A request that changes something must come from a page of this origin (or from no
    page at all: a typed URL, curl). `Sec-Fetch-Site` decides when the browser sends it: a
    sibling subdomain is `same-site`, and refused too. Older browsers: Origin must name this
    host."""
    if method.upper() in SAFE_METHODS:
        return None
    if fetch_site is not None:
        if fetch_site.lower() in ("same-origin", "none"):
            return None
        return f"cross-site request refused (Sec-Fetch-Site: {fetch_site})"
    if origin is None:
        return None
    netloc = urlsplit(origin).netloc.lower() if origin != "null" else ""
    if netloc and host_header is not None and netloc == host_header.strip().lower():
        return None
    return "cross-site request refused (its Origin is not this server)"


def refuse_content_type(
    method: str, content_type: str | None, content_length: str | None, chunked: bool
) -> str | None:
    """A write with a body must say it is JSON: a cross-site form can post `text/plain` (or
    urlencoded) without a preflight, never `application/json`."""
    if method.upper() in SAFE_METHODS:
        return None
    has_body = chunked or (content_length is not None and content_length.strip() not in ("", "0"))
    if not has_body:
        return None
    media = (content_type or "").partition(";")[0].strip().lower()
    json = media == "application/json" or media.endswith("+json")
    if json and media.startswith("application/"):
        return None
    return f"a JSON body is required: Content-Type: application/json (got {media or 'none'!r})"
