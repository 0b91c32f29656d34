"""loguru sinks per process, bound context, redaction.

Set up after fork (each process owns its sink). Never logs payloads (only sizes) or URL
passwords (redact_url, and scrub_known on every line). Templates are constants; text we did
not write goes in fields.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from typing import TYPE_CHECKING

from loguru import logger

if TYPE_CHECKING:
    from loguru import Record

from hivejobs.errors import ConfigError
from hivejobs.urls import scrub_known

_TEXT_FORMAT = (
    "<green>{time:YYYY-MM-DD HH:mm:ss.SSS}</green> <level>{level: <7}</level> "
    "<cyan>{extra[process]}</cyan> {message}"
)
# Context every line of a process carries: the process column already says it.
_SHOWN_ELSEWHERE = frozenset({"process", "worker_id", "hj_fields"})
# The loguru handlers this process added (never anybody else's: a host app's sinks stay).
_OUR_HANDLERS: list[int] = []
_LEVELS = ("TRACE", "DEBUG", "INFO", "SUCCESS", "WARNING", "ERROR", "CRITICAL")
MSG_LIBRARY = "a library logged"


# loguru's numbers for the levels hivejobs logs at.
_LEVEL_NO = {"TRACE": 5, "DEBUG": 10, "INFO": 20, "SUCCESS": 25, "WARNING": 30, "ERROR": 40}


def enabled(level: str) -> bool:
    """Whether a line at `level` would reach any sink (ours or a host app's): a per-job
    line skipped here costs nothing, where a filtered loguru call still builds its record
    context (~4 us) and a bound logger (~3 us) per job. Reads loguru's own minimum over its
    handlers (no public API says it); a loguru without it logs everything."""
    core = getattr(logger, "_core", None)
    return _LEVEL_NO[level] >= getattr(core, "min_level", 0)


def _stderr_sink(message: str) -> None:
    """Every line leaves through scrub_known(): a password we were given never reaches it."""
    try:
        sys.stderr.write(scrub_known(message))
        sys.stderr.flush()
    except (BrokenPipeError, ValueError):  # the reader went away, or stderr was closed
        pass


def log_level(default: str = "INFO") -> str:
    level = os.environ.get("HIVEJOBS_LOG_LEVEL", default).strip().upper()
    if level not in _LEVELS:
        raise ConfigError(f"HIVEJOBS_LOG_LEVEL={level!r} is not one of {', '.join(_LEVELS)}")
    return level


def setup_logging(process: str, default_level: str = "INFO") -> None:
    """Our one stderr sink (JSON lines when HIVEJOBS_LOG_FORMAT=json, for log shippers),
    replacing only the handlers we added earlier (and loguru's default one, which would print
    every line twice); sinks the user's own module added are kept. At `default_level` unless
    HIVEJOBS_LOG_LEVEL says otherwise."""
    level = log_level(default_level)
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
            format="{message}" if serialize else _text_format,
            diagnose=False,
            backtrace=False,
            colorize=False if serialize else _is_tty(),
        )
    )
    _route_library_logs(level)


class _LibraryLogs(logging.Handler):
    """Lines the libraries we use log through the standard `logging` module (psycopg's pool
    says so when it cannot connect or drops a broken connection) leave through our sink like
    ours: in the process's format (a JSON line among JSON lines), with the process column,
    scrubbed of known passwords. Python's own last-resort handler printed them as bare text
    on stderr. Their text is not ours: it goes in a field."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            logger.opt(exception=record.exc_info or None).log(
                _loguru_level(record.levelno),
                MSG_LIBRARY,
                library=record.name,
                text=record.getMessage(),
            )
        except Exception:  # a record whose arguments do not fit its format, say
            self.handleError(record)


_LIBRARY_LOGS = _LibraryLogs()


def _route_library_logs(level: str) -> None:
    """Our sink becomes the standard library's handler of last resort: it gets what a library
    logs from WARNING up (their INFO is a line per connection checkout) only while no handler
    is configured, so an app that sets up `logging` (`basicConfig` at import, even after this)
    keeps every line to its own handlers."""
    _LIBRARY_LOGS.setLevel(max(logging.WARNING, logging.getLevelNamesMapping().get(level, 0)))
    logging.lastResort = _LIBRARY_LOGS


def _loguru_level(levelno: int) -> str:
    for name, number in (("CRITICAL", 50), ("ERROR", 40), ("WARNING", 30), ("INFO", 20)):
        if levelno >= number:
            return name
    return "DEBUG"


def _text_format(record: Record) -> str:
    """One short line: the fields a reader does not already see, floats rounded; the
    traceback (if any) on the lines below. Not repeated: the process's own context, a job's
    type and id once the message starts `type[id]`, the pool named in the process column,
    and a float the message already shows."""
    extra = record["extra"]
    message = record["message"]
    hidden = set(_SHOWN_ELSEWHERE)
    if f"{extra.get('job_type')}[{extra.get('job_id')}]" in message:
        hidden |= {"job_type", "job_id"}
    if f"{extra.get('pool')}#" in str(extra.get("process", "")):
        hidden.add("pool")
    fields = {}
    for key, value in extra.items():
        if isinstance(value, float):
            value = round(value, 3)
            if f"{value}" in message:
                continue
        if key not in hidden:
            fields[key] = value
    # The fields are text we did not write: handed over in extra, never in the template.
    extra["hj_fields"] = f" {fields}" if fields else ""
    tail = "\n{exception}" if record["exception"] is not None else ""
    return _TEXT_FORMAT + "<dim>{extra[hj_fields]}</dim>" + tail + "\n"


def emit_banner(lines: list[str], fields: dict[str, object]) -> None:
    """The start-up banner: plain lines on stderr for a person at a terminal, one record
    with the same facts as fields for a log shipper (JSON). Shown from INFO down."""
    if _LEVELS.index(log_level()) > _LEVELS.index("INFO"):
        return
    if os.environ.get("HIVEJOBS_LOG_FORMAT", "text") == "json":
        logger.info("worker starting", **fields)
    else:
        _stderr_sink("".join(line + "\n" for line in lines))


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


def error_fields(exc: BaseException) -> dict[str, str]:
    """Log fields for an exception: its message and its type name. Not repr(): a redis-py
    error's repr is only ``server:ResponseError``, without the server's message."""
    return {"error": str(exc) or type(exc).__name__, "error_type": type(exc).__name__}
