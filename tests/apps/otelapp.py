"""The app of the tracing process tests: `hivejobs run tests.apps.otelapp:app`.

Each forked process configures the OpenTelemetry SDK in `App.on_process_start`, as
docs/howto/opentelemetry.md advises (or, with HJ_OTEL_SETUP=import, the supervisor does at
import, before it forks): a batch processor exporting to the JSON-lines file $HJ_SPANS
(tests/otel.py). Its schedule delay is longer than any test: the spans reach the
file only when the pool flushes before it exits, which is what a test of that flush needs.
"""

from __future__ import annotations

import os
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from hivejobs import App, Backoff, JobContext
from tests.otel import FileSpanExporter

app = App()


def configure_tracing() -> None:
    provider = TracerProvider()
    exporter = FileSpanExporter(os.environ["HJ_SPANS"])
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=600_000))
    trace.set_tracer_provider(provider)


if os.environ.get("HJ_OTEL_SETUP") == "import":
    # At import, in the supervisor, before it forks: the SDK restarts the batch processor's
    # thread in each child, and each child flushes before its os._exit.
    configure_tracing()
else:
    app.on_process_start(configure_tracing)


@app.job("otel_step", concurrency=2)
def otel_step(ctx: JobContext, payload: dict[str, Any]) -> str:
    """A handler's own span: a child of its attempt's span."""
    with trace.get_tracer("tests.otelapp").start_as_current_span("step body"):
        return str(payload["key"])


@app.job("otel_flaky", concurrency=2, attempts=2, backoff=Backoff(base_s=0.05))
def otel_flaky(ctx: JobContext, payload: dict[str, Any]) -> None:
    raise ValueError(f"flaky attempt {ctx.attempt}")


@app.job("otel_async", concurrency=2)
async def otel_async(ctx: JobContext, payload: dict[str, Any]) -> str:
    """An `async def` handler, a task on the pool's loop: its span is current in the task."""
    with trace.get_tracer("tests.otelapp").start_as_current_span("async body"):
        return "ok"
