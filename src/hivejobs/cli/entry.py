"""The `hivejobs` console script: parse, run the command, and turn what it raised into one
line on stderr and an exit code (ExitCode in shared.py; the error's kind says which).

Never prints a traceback for an error we raised on purpose, nor a value from one.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

import psycopg
import redis
from loguru import logger

from hivejobs.cli.parser import build_parser
from hivejobs.cli.shared import ExitCode, close_opened
from hivejobs.display import escape
from hivejobs.errors import BAD_INPUT, HivejobsError, UsageError
from hivejobs.logs import error_text, setup_logging
from hivejobs.urls import scrub_known


def _check_text_arguments(args: argparse.Namespace) -> None:
    """Arguments are decoded with surrogateescape: bytes that are not UTF-8 become lone
    surrogates, which neither Postgres nor JSON can carry. Refuse them here (a file name is
    only opened, so it may be any bytes)."""
    for name, value in vars(args).items():
        if name == "file" or not isinstance(value, str):
            continue
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            shown = value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
            option = name.replace("_", "-")
            raise UsageError(f"{option} {escape(shown)!r} is not valid UTF-8") from None


def _unexpected(exc: BaseException) -> str:
    """One line for an error we did not raise on purpose; the traceback at DEBUG level."""
    logger.opt(exception=exc).debug("unexpected error")
    if isinstance(exc, psycopg.Error):
        return f"Postgres error: {exc}"
    if isinstance(exc, redis.RedisError):
        return f"Redis error: {error_text(exc)}"
    return (
        f"unexpected {error_text(exc)} (a bug: please report it; "
        "HIVEJOBS_LOG_LEVEL=DEBUG shows the traceback)"
    )


def _fail(code: int, message: str) -> int:
    try:
        one_line = " ".join(escape(line) for line in message.strip().split("\n"))
        print(f"hivejobs: {scrub_known(one_line)}", file=sys.stderr)
    except (BrokenPipeError, ValueError):
        pass
    return code


def _stdout_gone() -> int:
    """The reader of our output went away (`hivejobs jobs | head -1`): not an error of ours.
    Point stdout at /dev/null so that the interpreter's final flush stays quiet, and exit as
    a process killed by SIGPIPE would (128 + 13), which pipelines expect."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return ExitCode.STDOUT_GONE


# Processes whose log is their output; the other commands answer on stdout and log warnings.
LONG_RUNNING = frozenset({"run", "serve", "dev", "bench"})


def main(argv: Sequence[str] | None = None) -> int:
    try:
        setup_logging("cli")
        if not (sys.argv[1:] if argv is None else argv):
            # No command: the usage and the command list, and exit 2 as for any bad usage.
            print(build_parser().format_help(), file=sys.stderr, end="")
            return ExitCode.USAGE
        args = build_parser().parse_args(argv)
        if args.command not in LONG_RUNNING:
            # A one-shot command prints its own answer: the library's INFO line about the
            # same act ("job replayed", "chain stored") would say it a second time.
            setup_logging("cli", default_level="WARNING")
        _check_text_arguments(args)
        code = int(args.fn(args))
        sys.stdout.flush()  # inside the try: a closed pipe is handled below
        return code
    except BrokenPipeError:
        return _stdout_gone()
    except HivejobsError as exc:
        return _fail(ExitCode.USAGE if exc.kind in BAD_INPUT else ExitCode.FAILED, str(exc))
    except KeyboardInterrupt:
        return ExitCode.INTERRUPTED
    except Exception as exc:  # one line, never a traceback with values in it
        return _fail(ExitCode.FAILED, _unexpected(exc))
    finally:
        close_opened()
