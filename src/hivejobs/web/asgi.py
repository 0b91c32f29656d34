"""The ASGI app: routes, the guard (web pages, tokens), error mapping, OpenAPI at /schema.

    from hivejobs.web import create_app
    asgi = create_app(app, admin_tokens=["..."])   # mount it in your own ASGI app

Needs the `web` extra (`pip install hivejobs[web]`). Every route but /healthz and the login
page requires a token or a dashboard session when tokens are configured (auth.py); with none
(`allow_open=True`, which `hivejobs serve` passes on loopback only) every loopback client is
admin. In both modes the guard first refuses what a web page in the operator's browser could
send (shield.py), and every response carries the headers that keep pages from framing or
sniffing it.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from typing import Any

from litestar import Litestar
from litestar.connection import ASGIConnection
from litestar.datastructures import MutableScopeHeaders, State
from litestar.exceptions import (
    HTTPException,
    NotAuthorizedException,
    PermissionDeniedException,
)
from litestar.handlers.base import BaseRouteHandler
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import JsonRenderPlugin
from litestar.types import Message, Scope
from loguru import logger

from hivejobs.client.app import App
from hivejobs.errors import ConfigError
from hivejobs.web import (
    api,
    batches,
    dashboard,
    errors,
    events,
    fair,
    fleet,
    flow,
    inputs,
    render,
    sequence,
    shield,
)
from hivejobs.web.auth import (
    SESSION_COOKIE,
    Role,
    Sessions,
    Throttle,
    Tokens,
    bearer,
    check_throttle,
    check_tokens,
    client_address,
    failed_authentication,
)

DEFAULT_MAX_BODY = 2 * 1024 * 1024


def guard(connection: ASGIConnection[Any, Any, Any, Any], handler: BaseRouteHandler) -> None:
    """Refuses, in this order: another Host (400), a non-loopback client in open mode (403),
    a write from another site (403), a write whose body is not JSON (415); then, unless the
    route is public or the server open, no credentials (401), a throttled client (429) and
    a read-only role on an admin route (403)."""
    state = connection.app.state
    headers = connection.headers
    host = headers.get("host")
    refusal = shield.refuse_host(host, state.allowed_hosts)
    if refusal:
        raise HTTPException(status_code=400, detail=refusal)
    tokens: Tokens = state.tokens
    if tokens.open and not _loopback_client(connection):
        raise PermissionDeniedException("no token configured: only loopback clients are served")
    method = str(connection.scope.get("method", "GET"))
    refusal = shield.refuse_cross_site(
        method, host, headers.get("origin"), headers.get("sec-fetch-site")
    )
    if refusal:
        raise PermissionDeniedException(refusal)
    if not handler.opt.get("form"):
        chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        refusal = shield.refuse_content_type(
            method, headers.get("content-type"), headers.get("content-length"), chunked
        )
        if refusal:
            raise HTTPException(status_code=415, detail=refusal)
    if handler.opt.get("public") or tokens.open:
        return
    role = authenticate(connection)
    if role is None:
        raise NotAuthorizedException(
            "a valid token is required: Authorization: Bearer <token>",
            headers={"WWW-Authenticate": 'Bearer realm="hivejobs"'},
        )
    if role == "callback":
        # Least privilege: the reporting service posts its type's callbacks, nothing else.
        name = connection.path_params.get("name")
        presented = bearer(connection.headers.get("authorization")) or ""
        if not handler.opt.get("callback") or name not in tokens.callback_types(presented):
            raise PermissionDeniedException(
                "a callback token may only post status callbacks of its own job type"
            )
        return
    if handler.opt.get("admin") and role != "admin":
        raise PermissionDeniedException("this token is read-only: an admin token is required")


def authenticate(connection: ASGIConnection[Any, Any, Any, Any]) -> Role | None:
    """The role of a bearer token (counted against the client when wrong), else of the
    dashboard session cookie."""
    state = connection.app.state
    presented = bearer(connection.headers.get("authorization"))
    if presented is None:
        sessions: Sessions = state.sessions
        return sessions.role_of(connection.cookies.get(SESSION_COOKIE))
    client = client_address(connection)
    check_throttle(state.throttle, client)
    tokens: Tokens = state.tokens
    role = tokens.role_of(presented)
    if role is None:
        failed_authentication(state.throttle, client, connection.url.path)
    return role


def _loopback_client(connection: ASGIConnection[Any, Any, Any, Any]) -> bool:
    """A unix socket (no address) counts as local, as only local users can reach it."""
    if connection.client is None:
        return True
    try:
        return ipaddress.ip_address(connection.client.host).is_loopback
    except ValueError:
        return True


async def security_headers(message: Message, scope: Scope) -> None:
    """The same headers on every response, errors and 404s included (shield.HEADERS)."""
    if message["type"] == "http.response.start":
        headers = MutableScopeHeaders.from_message(message)
        for name, value in shield.HEADERS:
            headers[name.decode()] = value.decode()


def create_app(
    app: App,
    *,
    read_tokens: Sequence[str] = (),
    admin_tokens: Sequence[str] = (),
    callback_tokens: Sequence[tuple[str, str]] = (),
    callback_secrets: Sequence[tuple[str, str]] = (),
    allow_open: bool = False,
    allowed_hosts: Sequence[str] = (),
    max_body_bytes: int = DEFAULT_MAX_BODY,
    base_path: str = "",
    debug: bool = False,
) -> Litestar:
    """The ASGI app over `app` (its job types, its Postgres and Redis). `callback_tokens`:
    (job type, token) pairs that may only post that type's status callbacks;
    `callback_secrets`: (job type, key) pairs whose callbacks must carry the body's HMAC."""
    check_tokens([token for _, token in callback_tokens], "callback_tokens")
    check_tokens([key for _, key in callback_secrets], "callback_secrets")
    tokens = Tokens(
        read=check_tokens(read_tokens, "read_tokens"),
        admin=check_tokens(admin_tokens, "admin_tokens"),
        callback=tuple(callback_tokens),
        secrets=tuple(callback_secrets),
    )
    if tokens.open:
        if not allow_open:
            raise ConfigError(
                "create_app: no read_tokens or admin_tokens, so every client would be admin; "
                "pass admin_tokens=[...] (and read_tokens), or allow_open=True to serve "
                "loopback clients without a token"
            )
        logger.warning("hivejobs web: no token configured, every loopback client is admin")

    def on_shutdown() -> None:
        app.close()

    state = State(
        {
            "hivejobs": app,
            "tokens": tokens,
            "base_path": base_path.rstrip("/"),
            "allowed_hosts": shield.allowed_hosts(allowed_hosts, tokens.open),
            "sessions": Sessions(),
            "throttle": Throttle(),
        }
    )
    return Litestar(
        route_handlers=[
            *api.HANDLERS,
            *events.HANDLERS,
            *fleet.HANDLERS,
            *flow.HANDLERS,
            *fair.HANDLERS,
            *sequence.HANDLERS,
            *dashboard.HANDLERS,
            *batches.HANDLERS,
        ],
        guards=[guard],
        before_request=inputs.refuse_nul,
        exception_handlers=errors.HANDLERS,
        request_max_body_size=max_body_bytes,
        state=state,
        on_shutdown=[on_shutdown],
        before_send=[security_headers],
        template_config=render.template_config(),
        openapi_config=OpenAPIConfig(
            title="hivejobs",
            version="1",
            description="Durable jobs over HTTP: enqueue, read, cancel, replay, status "
            "callbacks, chains, pause and scale job types. Errors are JSON: "
            "{error, status, details?}.",
            path="/schema",
            operation_id_creator=_operation_id,
            # The spec only: the UIs Litestar offers load their scripts from a CDN, which
            # would run third-party code on the admin origin.
            render_plugins=[JsonRenderPlugin()],
        ),
        debug=debug,
        # Litestar's default installs a root `logging` handler: psycopg's and httpx's lines
        # then bypassed our sink (unscrubbed, plain text among JSON lines). None keeps ours.
        logging_config=None,
    )


def _operation_id(handler: Any, method: Any, parts: list[Any]) -> str:
    """The handler's own name (sync handlers are wrapped, hiding it from Litestar)."""
    fn = getattr(handler.fn, "ref", None) or getattr(handler.fn, "func", None) or handler.fn
    name = getattr(getattr(fn, "value", fn), "__name__", None)
    return str(name) if name else f"{method}_{'_'.join(map(str, parts))}"
