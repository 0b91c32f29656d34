"""What every command module shares: the exit codes, the App a command opens (closed by
`main` when the command ends), the time arguments, and JSON and table output on stdout.

Never parses arguments nor maps errors (parser.py and entry.py do).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from datetime import UTC, datetime
from enum import IntEnum

import msgspec
from loguru import logger

from hivejobs.cli.views import table
from hivejobs.client.app import App, load_app
from hivejobs.client.listing import parse_iso, parse_moment, parse_span
from hivejobs.display import escape


class ExitCode(IntEnum):
    """Every exit status of a `hivejobs` command (but `run` and `dev`, which pass on the
    supervisor's or the worker's own)."""

    OK = 0
    FAILED = 1  # an error we raised on purpose, or an unexpected one (one line on stderr)
    USAGE = 2  # bad usage or bad input, as argparse exits: nothing was stored
    INTERRUPTED = 130  # Ctrl-C: 128 + SIGINT, as a shell reports it
    STDOUT_GONE = 141  # our reader went away (`| head`): 128 + SIGPIPE, as pipelines expect


_OPENED: list[App] = []  # closed when the command ends: no pool left for __del__ to stop


def open_app(args: argparse.Namespace) -> App:
    """The App of --app (or HIVEJOBS_APP), else one from the environment's settings; `main`
    closes it when the command ends."""
    spec = getattr(args, "app", None) or os.environ.get("HIVEJOBS_APP")
    app = load_app(spec) if spec else App()
    _OPENED.append(app)
    return app


def close_opened() -> None:
    """Close every App the command opened; a failure here is logged, never shown: the
    command's answer is already out."""
    while _OPENED:
        try:
            _OPENED.pop().close()
        except Exception as exc:  # the command's answer is already out
            logger.opt(exception=exc).debug("closing the app failed")


def future_moment(text: str | None) -> datetime | None:
    """--run-at / --expires-at: ISO 8601 (UTC when no zone is named) or a span from now."""
    if text is None:
        return None
    span = parse_span(text)
    return datetime.now(UTC) + span if span is not None else parse_iso(text)


def past_moment(text: str | None) -> datetime | None:
    """--since / --until: ISO 8601 or a span back from now ("1h")."""
    return None if text is None else parse_moment(text)


def print_json(data: object) -> None:
    text = msgspec.json.format(msgspec.json.encode(data), indent=2).decode()
    # msgspec escapes control characters in strings, not format ones (U+202E): escape lines.
    print("\n".join(escape(line) for line in text.split("\n")))


def print_table(rows: Sequence[Sequence[object]]) -> None:
    """Every cell escaped (views.table): names, hosts and texts come from users and
    handlers."""
    print("\n".join(table(rows)))
