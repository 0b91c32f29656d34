"""loguru sinks per process, bound context, redaction.

Set up after fork (each process owns its sink). Never logs payloads (only sizes) or URL
passwords (redact_url). Templates are constants; text we did not write goes in fields.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from loguru import logger

EXIT_THREAD_CRASHED = 70

_TEXT_FORMAT = (
    "<green>{time:YYYY-MM-DD HH:mm:ss.SSS}</green> <level>{level: <7}</level> "
    "<cyan>{extra[process]}</cyan> {message} <dim>{extra}</dim>"
)


def setup_logging(process: str) -> None:
    """One stderr sink; JSON lines when HIVEJOBS_LOG_FORMAT=json (for log shippers)."""
    logger.remove()
    logger.configure(extra={"process": process})
    level = os.environ.get("HIVEJOBS_LOG_LEVEL", "INFO").upper()
    if os.environ.get("HIVEJOBS_LOG_FORMAT", "text") == "json":
        logger.add(sys.stderr, level=level, serialize=True, diagnose=False, backtrace=False)
    else:
        logger.add(
            sys.stderr,
            level=level,
            format=_TEXT_FORMAT,
            diagnose=False,
            backtrace=False,
            colorize=None,
        )


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
