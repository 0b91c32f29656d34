"""The handlers' ledger: one line per event in $HJ_LEDGER/ledger.<pid>.

O_APPEND and one write per line (shorter than PIPE_BUF): lines never interleave and survive
kill -9, and the ledger is readable while Postgres or Redis are down.
"""

from __future__ import annotations

import asyncio
import os

LEDGER = os.environ.get("HJ_LEDGER", "/tmp")


def note(*fields: object) -> None:
    line = " ".join(str(f) for f in fields) + "\n"
    fd = os.open(f"{LEDGER}/ledger.{os.getpid()}", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def handler_kind() -> str:
    """ "async" when called on a running event loop (an `async def` handler's task), else
    "def": the ledger's proof of how the pool ran a handler."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return "def"
    return "async"
