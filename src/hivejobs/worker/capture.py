"""Per-attempt capture of what a handler prints, for the chain job log (spincycle keeps each
job's output beside its log entry).

sys.stdout and sys.stderr are process-wide while a pool runs handlers in threads and as
tasks on one event loop: install() puts a proxy in front of each that copies a write into
the buffer of the calling context (a context variable: a thread's, or an asyncio task's and
what it hands to threads with asyncio.to_thread) when that context captures, and always
passes it on to the real stream, so output never disappears from the process's own log. A
buffer keeps the last `limit` bytes (the end of the output is where errors are). Only writes
through sys.stdout/sys.stderr are seen: a subprocess writing to the inherited file
descriptors is not. Never sees payloads, only what handlers print.
"""

from __future__ import annotations

import sys
import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TextIO, cast

_captured: ContextVar[Captured | None] = ContextVar("hivejobs_captured", default=None)
_install_lock = threading.Lock()


class Tail:
    """The last `limit` bytes written (UTF-8); `cut` counts the bytes dropped before them."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.parts: deque[bytes] = deque()
        self.size = 0
        self.cut = 0

    def write(self, text: str) -> None:
        data = text.encode("utf-8", "replace")
        self.parts.append(data)
        self.size += len(data)
        while self.size > self.limit and self.parts:
            over = self.size - self.limit
            first = self.parts[0]
            if len(first) <= over:
                self.parts.popleft()
                self.size -= len(first)
                self.cut += len(first)
            else:
                self.parts[0] = first[over:]
                self.size -= over
                self.cut += over

    def text(self) -> str | None:
        """None when nothing was written; a cut tail says how much it lost."""
        if not self.size and not self.cut:
            return None
        body = b"".join(self.parts).decode("utf-8", "replace").replace("\x00", "\\x00")
        return f"[... {self.cut} bytes cut ...]\n{body}" if self.cut else body


class Captured:
    """One handler call's output, per stream."""

    def __init__(self, limit: int) -> None:
        self.stdout = Tail(limit)
        self.stderr = Tail(limit)

    @property
    def empty(self) -> bool:
        return not (self.stdout.size or self.stdout.cut or self.stderr.size or self.stderr.cut)

    @property
    def truncated(self) -> bool:
        return bool(self.stdout.cut or self.stderr.cut)


class _Proxy:
    """Stands in for sys.stdout or sys.stderr: the real stream gets every write."""

    def __init__(self, real: TextIO, which: str) -> None:
        self._real = real
        self._which = which

    def write(self, text: str) -> int:
        captured = _captured.get()
        if captured is not None and isinstance(text, str):
            getattr(captured, self._which).write(text)
        return self._real.write(text)

    def writelines(self, lines: list[str]) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        self._real.flush()

    def __getattr__(self, name: str) -> object:
        return getattr(self._real, name)


def install() -> None:
    """Put the proxies in place once per process (after fork, in the pool)."""
    with _install_lock:
        if sys.stdout is not None and not isinstance(sys.stdout, _Proxy):
            sys.stdout = cast(TextIO, _Proxy(sys.stdout, "stdout"))
        if sys.stderr is not None and not isinstance(sys.stderr, _Proxy):
            sys.stderr = cast(TextIO, _Proxy(sys.stderr, "stderr"))


@contextmanager
def capturing(limit: int) -> Iterator[Captured]:
    """Capture this context's writes to stdout and stderr for the duration of the block."""
    install()
    captured = Captured(limit)
    token = _captured.set(captured)
    try:
        yield captured
    finally:
        _captured.reset(token)


@contextmanager
def uncaptured() -> Iterator[None]:
    """Writes of this context inside the block are not captured (hivejobs' own lines)."""
    token = _captured.set(None)
    try:
        yield
    finally:
        _captured.reset(token)
