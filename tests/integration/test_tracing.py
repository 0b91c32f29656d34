"""OpenTelemetry in the enqueuing process (tracing.py), with the SDK's in-memory exporter:
the enqueue span is a child of the caller's span and its context is stored in the job row,
never in the payload; a batch and a chain each have one span whose context their rows carry;
with no SDK configured nothing is made and the column stays NULL.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Callable

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind

from hivejobs import App, Chain, JobContext
from tests.harness import ROOT, sql
from tests.otel import recording


def _traced_app(make_app: Callable[..., App]) -> App:
    app = make_app()

    @app.job("traced")
    def traced(ctx: JobContext, payload: dict[str, int]) -> None:
        return None

    return app


def _traceparent(span: ReadableSpan) -> str:
    ctx = span.get_span_context()
    assert ctx is not None
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def _only(spans: tuple[ReadableSpan, ...], name: str) -> ReadableSpan:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, [s.name for s in spans]
    return found[0]


def _trace_context(url: str, table: str, row_id: str) -> str | None:
    rows = sql(url, f"SELECT trace_context FROM {table} WHERE id = %s", (row_id,))
    return rows[0][0] if rows else "missing"


def test_enqueue_span_is_a_child_of_the_callers_span_and_its_context_is_in_the_row(
    make_app: Callable[..., App], database_url: str
) -> None:
    app = _traced_app(make_app)
    with recording() as exporter:
        with trace.get_tracer("test").start_as_current_span("request"):
            job_id = app.enqueue("traced", {"n": 1})
        spans = exporter.get_finished_spans()
    request, enqueue = _only(spans, "request"), _only(spans, "enqueue traced")
    assert enqueue.kind == SpanKind.PRODUCER
    assert enqueue.parent is not None and request.context is not None
    assert enqueue.parent.span_id == request.context.span_id
    assert enqueue.attributes is not None and enqueue.attributes["hivejobs.job.id"] == job_id
    assert _trace_context(database_url, "hivejobs_job", job_id) == _traceparent(enqueue)
    # The payload is the caller's alone: nothing of the trace went into it.
    payload = sql(database_url, "SELECT payload FROM hivejobs_job WHERE id = %s", (job_id,))
    assert json.loads(bytes(payload[0][0])) == {"n": 1}


def test_async_enqueue_span_follows_the_callers_span_across_awaits(
    make_app: Callable[..., App], database_url: str
) -> None:
    app = _traced_app(make_app)

    async def main() -> str:
        with trace.get_tracer("test").start_as_current_span("async request"):
            job_id = await app.aenqueue("traced", {"n": 2})
        await app.aclose()
        return job_id

    with recording() as exporter:
        job_id = asyncio.run(main())
        spans = exporter.get_finished_spans()
    request, enqueue = _only(spans, "async request"), _only(spans, "enqueue traced")
    assert enqueue.parent is not None and request.context is not None
    assert enqueue.parent.span_id == request.context.span_id
    assert _trace_context(database_url, "hivejobs_job", job_id) == _traceparent(enqueue)


def test_a_batch_has_one_span_whose_context_every_row_carries(
    make_app: Callable[..., App], database_url: str
) -> None:
    app = _traced_app(make_app)
    with recording() as exporter:
        ids = app.enqueue_many("traced", [{"n": i} for i in range(3)])
        batch = _only(exporter.get_finished_spans(), "enqueue_many traced")
    assert batch.attributes is not None and batch.attributes["hivejobs.job.count"] == 3
    rows = sql(database_url, "SELECT trace_context FROM hivejobs_job WHERE id = ANY(%s)", (ids,))
    assert [r[0] for r in rows] == [_traceparent(batch)] * 3


def test_a_chain_has_one_span_whose_context_is_stored_on_the_chain(
    make_app: Callable[..., App], database_url: str
) -> None:
    app = _traced_app(make_app)
    chain = Chain("traced chain")
    first = chain.job("traced", {"n": 1}, key="a")
    chain.job("traced", {"n": 2}, key="b", after=[first])
    with recording() as exporter:
        with trace.get_tracer("test").start_as_current_span("request"):
            chain_id = app.run_chain(chain)
        spans = exporter.get_finished_spans()
    request, submit = _only(spans, "request"), _only(spans, "run_chain traced chain")
    assert submit.parent is not None and request.context is not None
    assert submit.parent.span_id == request.context.span_id
    assert _trace_context(database_url, "hivejobs_chain", chain_id) == _traceparent(submit)


def test_without_an_sdk_no_context_is_stored(database_url: str, redis_prefix: str) -> None:
    """A process of its own (this one's global provider may be set): the API installed, no
    SDK configured, so the row's column stays NULL."""
    code = (
        "from hivejobs import App\n"
        f"app = App(database_url={database_url!r}, prefix={redis_prefix!r})\n"
        "app.job('traced')(lambda ctx, payload: None)\n"
        "print(app.enqueue('traced', {'n': 1}))\n"
        "app.close()\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip().splitlines()[-1]
    assert _trace_context(database_url, "hivejobs_job", job_id) is None
