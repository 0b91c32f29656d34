"""`hivejobs serve [MODULE:APP]`: uvicorn running create_app, with the binding rule: no token
configured means loopback only (anyone who can connect would be admin), and tokens too short
to resist guessing are refused before anything listens."""

from __future__ import annotations

import argparse
import ipaddress
import os
import socket

from loguru import logger

from hivejobs.errors import ConfigError
from hivejobs.web.auth import check_tokens, parse_tokens, parse_typed


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        try:
            return all(
                ipaddress.ip_address(info[4][0]).is_loopback
                for info in socket.getaddrinfo(host, None)
            )
        except (OSError, ValueError):
            return False


def serve_main(args: argparse.Namespace) -> int:
    from hivejobs.client.app import App, load_app
    from hivejobs.errors import UsageError

    try:
        import uvicorn

        from hivejobs.web.asgi import create_app
    except ImportError as exc:
        raise UsageError(f"{exc.name} is missing: pip install 'hivejobs[web]'") from None
    spec = args.app_spec or os.environ.get("HIVEJOBS_APP")
    app = load_app(spec) if spec else App()
    read, admin = (
        check_tokens(parse_tokens(os.environ.get(name)), name)
        for name in ("HIVEJOBS_READ_TOKENS", "HIVEJOBS_ADMIN_TOKENS")
    )
    hosts = parse_tokens(os.environ.get("HIVEJOBS_ALLOWED_HOSTS"))
    callback = parse_typed(os.environ.get("HIVEJOBS_CALLBACK_TOKENS"), "HIVEJOBS_CALLBACK_TOKENS")
    secrets = parse_typed(os.environ.get("HIVEJOBS_CALLBACK_SECRETS"), "HIVEJOBS_CALLBACK_SECRETS")
    if not read and not admin:
        if not is_loopback(args.host):
            raise ConfigError(
                f"no token configured, so every client would be admin: refusing to listen on "
                f"{args.host}. Set HIVEJOBS_ADMIN_TOKENS (and HIVEJOBS_READ_TOKENS), or "
                "listen on 127.0.0.1"
            )
        # create_app says it (once): it warns whoever serves it open, mounted or not.
    if args.max_body_bytes <= 0:
        raise UsageError("--max-body-bytes must be positive")
    app.connections.store.check_schema()  # a clear `hivejobs migrate` message before listening
    asgi = create_app(
        app,
        read_tokens=read,
        admin_tokens=admin,
        callback_tokens=callback,
        callback_secrets=secrets,
        allow_open=not read and not admin,  # on loopback only, checked above
        allowed_hosts=hosts,
        max_body_bytes=args.max_body_bytes,
    )
    logger.info("serving", host=args.host, port=args.port, tokens=len(read) + len(admin))
    shown = f"[{args.host}]" if ":" in args.host else args.host
    print(f"dashboard: http://{shown}:{args.port}/dashboard", flush=True)
    # No log_config: uvicorn's lines reach our one sink (scrubbed, JSON among JSON).
    uvicorn.run(
        asgi,
        host=args.host,
        port=args.port,
        log_level="warning",
        access_log=False,
        log_config=None,
    )
    return 0
