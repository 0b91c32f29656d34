"""`hivejobs serve` arguments; kept apart so that the CLI builds its parser without the web
extra installed (serve itself says what to install)."""

from __future__ import annotations

import argparse


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("app_spec", nargs="?", metavar="MODULE:APP", help="(or HIVEJOBS_APP)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=8080, help="port to listen on")
    p.add_argument(
        "--max-body-bytes",
        type=int,
        default=2 * 1024 * 1024,
        help="larger request bodies are refused with 413",
    )
    p.epilog = (
        "Tokens: HIVEJOBS_ADMIN_TOKENS and HIVEJOBS_READ_TOKENS (comma-separated, 20 "
        "characters or more). Without any, every local client that is not a web page is admin "
        "and the server listens on loopback only. HIVEJOBS_ALLOWED_HOSTS: Host names to "
        "accept besides the loopback ones (checked always without tokens, with tokens when set). "
        "HIVEJOBS_CALLBACK_TOKENS=type:token,... may only post that type's status callbacks; "
        "HIVEJOBS_CALLBACK_SECRETS=type:key,... requires the body's HMAC on them."
    )
