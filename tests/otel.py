"""OpenTelemetry for the tests: the SDK's in-memory exporter in this process, and a span
exporter that writes JSON lines to a file, for the spans of a `hivejobs run` (whose pool
processes the test cannot reach in memory).

The SDK's global TracerProvider can be set once per process: `recording()` sets it on first
use, and its exporter keeps spans only while a test records (a switch), so the tests that run
later in the same process keep nothing.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


class _Switched(InMemorySpanExporter):
    """Keeps spans only while `on` is set."""

    on = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return super().export(spans) if self.on else SpanExportResult.SUCCESS


_EXPORTER = _Switched()
_LOCK = threading.Lock()


@contextmanager
def recording() -> Iterator[InMemorySpanExporter]:
    """The spans this process ends while the block runs (the SDK set as the global provider,
    once)."""
    with _LOCK:
        if not isinstance(trace.get_tracer_provider(), TracerProvider):
            provider = TracerProvider()
            provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
            trace.set_tracer_provider(provider)
    _EXPORTER.clear()
    _EXPORTER.on = True
    try:
        yield _EXPORTER
    finally:
        _EXPORTER.on = False
        _EXPORTER.clear()


class FileSpanExporter(SpanExporter):
    """One JSON line per span, appended with one write (O_APPEND): several processes may
    share the file."""

    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(json.dumps(span_record(s)) + "\n" for s in spans)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, lines.encode())
        finally:
            os.close(fd)
        return SpanExportResult.SUCCESS


def span_record(span: ReadableSpan) -> dict[str, Any]:
    """What the tests compare: ids as hex, the parent, the links, status and events."""
    ctx = span.get_span_context()
    assert ctx is not None
    return {
        "name": span.name,
        "kind": span.kind.name,
        "trace_id": f"{ctx.trace_id:032x}",
        "span_id": f"{ctx.span_id:016x}",
        "parent_id": f"{span.parent.span_id:016x}" if span.parent else None,
        "links": [f"{link.context.span_id:016x}" for link in span.links],
        "attributes": dict(span.attributes or {}),
        "status": span.status.status_code.name,
        "events": [e.name for e in span.events],
        "pid": os.getpid(),
    }


def read_spans(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]
