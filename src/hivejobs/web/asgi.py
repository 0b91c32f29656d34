"""The ASGI app: routes, the token guard, error mapping, OpenAPI at /schema.

    from hivejobs.web import create_app
    asgi = create_app(app, admin_tokens=["..."])   # mount it in your own ASGI app

Needs the `web` extra (`pip install hivejobs[web]`). Every route but /healthz and the login
page requires a token when tokens are configured (auth.py); with none, everyone is admin, and
`hivejobs serve` then listens on loopback only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from litestar import Litestar
from litestar.connection import ASGIConnection
from litestar.exceptions import NotAuthorizedException, PermissionDeniedException
from litestar.handlers.base import BaseRouteHandler
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import SwaggerRenderPlugin
from loguru import logger

from hivejobs.client.app import App
from hivejobs.web import api, dashboard, errors, fleet, flow
from hivejobs.web.auth import COOKIE, Tokens, bearer

DEFAULT_MAX_BODY = 2 * 1024 * 1024


def guard(connection: ASGIConnection[Any, Any, Any, Any], handler: BaseRouteHandler) -> None:
    tokens: Tokens = connection.app.state.tokens
    if handler.opt.get("public") or tokens.open:
        return
    presented = bearer(connection.headers.get("authorization")) or connection.cookies.get(COOKIE)
    role = tokens.role_of(presented)
    if role is None:
        raise NotAuthorizedException(
            "a valid token is required: Authorization: Bearer <token>",
            headers={"WWW-Authenticate": 'Bearer realm="hivejobs"'},
        )
    if handler.opt.get("admin") and role != "admin":
        raise PermissionDeniedException("this token is read-only: an admin token is required")


def create_app(
    app: App,
    *,
    read_tokens: Sequence[str] = (),
    admin_tokens: Sequence[str] = (),
    max_body_bytes: int = DEFAULT_MAX_BODY,
    base_path: str = "",
    debug: bool = False,
) -> Litestar:
    """The ASGI app over `app` (its job types, its Postgres and Redis)."""
    tokens = Tokens(read=tuple(read_tokens), admin=tuple(admin_tokens))
    if tokens.open:
        logger.warning("hivejobs web: no token configured, every client is admin")

    def on_shutdown() -> None:
        app.close()

    return Litestar(
        route_handlers=[*api.HANDLERS, *fleet.HANDLERS, *flow.HANDLERS, *dashboard.HANDLERS],
        guards=[guard],
        exception_handlers=errors.HANDLERS,
        request_max_body_size=max_body_bytes,
        state=_state(app, tokens, base_path.rstrip("/")),
        on_shutdown=[on_shutdown],
        openapi_config=OpenAPIConfig(
            title="hivejobs",
            version="1",
            description="Durable jobs over HTTP: enqueue, read, cancel, replay, status "
            "callbacks, chains, pause and scale job types. Errors are JSON: "
            "{error, status, details?}.",
            path="/schema",
            operation_id_creator=_operation_id,
            render_plugins=[SwaggerRenderPlugin()],
        ),
        debug=debug,
    )


def _operation_id(handler: Any, method: Any, parts: list[Any]) -> str:
    """The handler's own name (sync handlers are wrapped, hiding it from Litestar)."""
    fn = getattr(handler.fn, "ref", None) or getattr(handler.fn, "func", None) or handler.fn
    name = getattr(getattr(fn, "value", fn), "__name__", None)
    return str(name) if name else f"{method}_{'_'.join(map(str, parts))}"


def _state(app: App, tokens: Tokens, base_path: str) -> Any:
    from litestar.datastructures import State

    return State({"hivejobs": app, "tokens": tokens, "base_path": base_path})
