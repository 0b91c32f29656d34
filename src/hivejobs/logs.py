"""loguru sinks per process, bound context, redaction.

Set up after fork (each process owns its sink). Never logs payloads (only sizes) or URL
passwords (redact_url, and scrub_known on every line). Templates are constants; text we did
not write goes in fields.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable

from loguru import logger

from hivejobs.config import scrub_known
from hivejobs.errors import ConfigError

EXIT_THREAD_CRASHED = 70

_TEXT_FORMAT = (
    "<green>{time:YYYY-MM-DD HH:mm:ss.SSS}</green> <level>{level: <7}</level> "
    "<cyan>{extra[process]}</cyan> {message} <dim>{extra}</dim>"
)
# The loguru handlers this process added (never anybody else's: a host app's sinks stay).
_OUR_HANDLERS: list[int] = []
_LEVELS = ("TRACE", "DEBUG", "INFO", "SUCCESS", "WARNING", "ERROR", "CRITICAL")


def _stderr_sink(message: str) -> None:
    """Every line leaves through scrub_known(): a password we were given never reaches it."""
    try:
        sys.stderr.write(scrub_known(message))
        sys.stderr.flush()
    except (BrokenPipeError, ValueError):  # the reader went away, or stderr was closed
        pass


def log_level() -> str:
    level = os.environ.get("HIVEJOBS_LOG_LEVEL", "INFO").strip().upper()
    if level not in _LEVELS:
        raise ConfigError(f"HIVEJOBS_LOG_LEVEL={level!r} is not one of {', '.join(_LEVELS)}")
    return level


def setup_logging(process: str) -> None:
    """Our one stderr sink (JSON lines when HIVEJOBS_LOG_FORMAT=json, for log shippers),
    replacing only the handlers we added earlier (and loguru's default one, which would print
    every line twice); sinks the user's own module added are kept."""
    level = log_level()
    for handler_id in _OUR_HANDLERS:
        with contextlib.suppress(ValueError):
            logger.remove(handler_id)
    if not _OUR_HANDLERS:
        with contextlib.suppress(ValueError):
            logger.remove(0)  # loguru's default stderr handler, added at its import
    _OUR_HANDLERS.clear()
    logger.configure(extra={"process": process})
    logger.enable("hivejobs")
    serialize = os.environ.get("HIVEJOBS_LOG_FORMAT", "text") == "json"
    _OUR_HANDLERS.append(
        logger.add(
            _stderr_sink,
            level=level,
            serialize=serialize,
            format="{message}" if serialize else _TEXT_FORMAT,
            diagnose=False,
            backtrace=False,
            colorize=False if serialize else _is_tty(),
        )
    )


def _is_tty() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def error_text(exc: BaseException) -> str:
    """An error for a log field: its type and message. Not repr(): with redis-py 8 the repr
    of a ConnectionError or ResponseError drops the message."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def fatal_on_error(target: Callable[[], None]) -> Callable[[], None]:
    """A pool thread that dies of an unexpected error would leave claims nobody finishes
    while the heartbeat says all is well: exit instead, so the supervisor releases them and
    starts a fresh process."""

    def guarded() -> None:
        try:
            target()
        except BaseException as exc:  # noqa: BLE001 - anything here is a bug or a failpoint
            logger.opt(exception=exc).critical("pool thread crashed: exiting the process")
            os._exit(EXIT_THREAD_CRASHED)

    return guarded


def error_fields(exc: BaseException) -> dict[str, str]:
    """Log fields for an exception: its message and its type name. Not repr(): a redis-py
    error's repr is only ``server:ResponseError``, without the server's message."""
    return {"error": str(exc) or type(exc).__name__, "error_type": type(exc).__name__}
