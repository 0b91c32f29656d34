"""`hivejobs serve`: the HTTP API, the dashboard and /metrics as one ASGI app (Litestar).

    from hivejobs.web import create_app
    asgi = create_app(app, admin_tokens=["..."])   # mount it in your own ASGI app

Needs the `web` extra (`pip install hivejobs[web]`); importing this package does not (the CLI
builds its parser from web/options.py without Litestar installed).

Layer: the top (with bench, dev, testing; under cli): may import client and everything
below it; nothing but the CLI imports it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from litestar import Litestar

    from hivejobs.client.app import App


def create_app(
    app: App,
    *,
    read_tokens: Sequence[str] = (),
    admin_tokens: Sequence[str] = (),
    callback_tokens: Sequence[tuple[str, str]] = (),
    callback_secrets: Sequence[tuple[str, str]] = (),
    allow_open: bool = False,
    allowed_hosts: Sequence[str] = (),
    max_body_bytes: int = 2 * 1024 * 1024,
    base_path: str = "",
    debug: bool = False,
) -> Litestar:
    """The ASGI app over `app` (its job types, its Postgres and Redis); see web/asgi.py.

    Tokens have at least 20 characters. Without any token, `allow_open=True` must be passed:
    every loopback client is then admin (others are refused), and only the loopback names
    and `allowed_hosts` may be in the Host header. `allowed_hosts` (a leading dot: a domain
    and its subdomains) also applies with tokens when given.

    `base_path`: where the host app mounts it, for the dashboard's links when the host does
    not say so in the ASGI `root_path` (Starlette's Mount does; Litestar's mounts do not).
    `callback_tokens` (job type, token): may only post that type's status callbacks;
    `callback_secrets` (job type, key): that type's callbacks must carry the body's HMAC."""
    from hivejobs.web.asgi import create_app as build

    return build(
        app,
        read_tokens=read_tokens,
        admin_tokens=admin_tokens,
        callback_tokens=callback_tokens,
        callback_secrets=callback_secrets,
        allow_open=allow_open,
        allowed_hosts=allowed_hosts,
        max_body_bytes=max_body_bytes,
        base_path=base_path,
        debug=debug,
    )
