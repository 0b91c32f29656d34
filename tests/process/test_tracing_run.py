"""OpenTelemetry across a real `hivejobs run tests.apps.otelapp:app`: the worker's pool
processes configure the SDK in App.on_process_start and export to a file (tests/otel.py);
this process records the enqueue side in memory. A 3-job chain is one trace: the chain's
submit span under the caller's span, each job's attempt a child of (and linked to) it, a
handler's own span under its attempt. A failing job's attempts are errors with the exception
recorded. An `async def` handler's attempt is traced alike. The pools' batch processor
exports only when flushed: the spans reach the file because a pool flushes before its
os._exit at shutdown.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan

from hivejobs import App, Chain
from tests.harness import Instance, wait_until
from tests.otel import read_spans, recording


def _hex_ids(span: ReadableSpan) -> tuple[str, str]:
    ctx = span.get_span_context()
    assert ctx is not None
    return f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"


@pytest.mark.parametrize("setup", ["hook", "import"])
def test_a_chain_is_one_trace_and_a_failing_attempt_is_an_error(
    setup: str,
    start_instance: Callable[..., Instance],
    make_app: Callable[..., App],
    tmp_path: Path,
) -> None:
    """`hook`: the SDK set up in App.on_process_start, after each fork; `import`: set up at
    import in the supervisor, before the forks (the SDK's own fork handling)."""
    from tests.apps.otelapp import app as declared

    spans_file = tmp_path / "spans.jsonl"
    env = {"HJ_SPANS": str(spans_file), "HJ_OTEL_SETUP": setup}
    inst = start_instance(env, app_spec="tests.apps.otelapp:app")
    app = make_app()
    app.types.update(declared.types)
    chain = Chain("three")
    a = chain.job("otel_step", {"key": "a"}, key="a")
    b = chain.job("otel_step", {"key": "b"}, key="b", after=[a])
    chain.job("otel_step", {"key": "c"}, key="c", after=[b])
    with recording() as exporter:
        with trace.get_tracer("test").start_as_current_span("request"):
            chain_id = app.run_chain(chain)
            flaky_id = app.enqueue("otel_flaky", {})
            async_id = app.enqueue("otel_async", {})
        local = {s.name: s for s in exporter.get_finished_spans()}
    wait_until(
        lambda: app.chain_status(chain_id).state == "succeeded", timeout=60, what="the chain"
    )
    assert app.wait(flaky_id, timeout=60).state == "failed"
    assert app.wait(async_id, timeout=60).state == "succeeded"

    inst.signal_group(signal.SIGTERM)
    assert inst.wait(timeout=60) == 0
    spans = read_spans(spans_file)

    trace_id, submit_id = _hex_ids(local["run_chain three"])
    _, request_id = _hex_ids(local["request"])
    assert local["run_chain three"].parent is not None
    assert f"{local['run_chain three'].parent.span_id:016x}" == request_id
    steps = sorted(
        (s for s in spans if s["name"] == "run otel_step"),
        key=lambda s: s["attributes"]["hivejobs.job.id"],
    )
    assert [s["attributes"]["hivejobs.job.id"].split(":")[1] for s in steps] == ["a", "b", "c"]
    for step in steps:
        assert step["trace_id"] == trace_id  # the chain is one trace
        assert step["parent_id"] == submit_id and step["links"] == [submit_id]
        assert step["kind"] == "CONSUMER"
        assert step["status"] == "UNSET"
        assert step["attributes"]["hivejobs.job.outcome"] == "succeeded"
        assert step["attributes"]["hivejobs.job.attempt"] == 1
        assert step["attributes"]["hivejobs.job.delivery"] == "at_least_once"
    bodies = [s for s in spans if s["name"] == "step body"]
    assert sorted(s["parent_id"] for s in bodies) == sorted(s["span_id"] for s in steps)

    _, enqueue_id = _hex_ids(local["enqueue otel_flaky"])
    attempts: list[dict[str, Any]] = sorted(
        (s for s in spans if s["name"] == "run otel_flaky"),
        key=lambda s: s["attributes"]["hivejobs.job.attempt"],
    )
    assert [s["attributes"]["hivejobs.job.attempt"] for s in attempts] == [1, 2]
    assert [s["attributes"]["hivejobs.job.outcome"] for s in attempts] == ["retry", "failed"]
    for attempt in attempts:
        assert attempt["trace_id"] == trace_id
        assert attempt["parent_id"] == enqueue_id and attempt["links"] == [enqueue_id]
        assert attempt["status"] == "ERROR"
        assert attempt["events"] == ["exception"]
        assert attempt["attributes"]["hivejobs.job.id"] == flaky_id

    # An `async def` handler's attempt (worker/tasks.py): the same span, current in its task.
    _, async_enqueue_id = _hex_ids(local["enqueue otel_async"])
    (run_async,) = [s for s in spans if s["name"] == "run otel_async"]
    assert run_async["parent_id"] == async_enqueue_id and run_async["trace_id"] == trace_id
    assert run_async["attributes"]["hivejobs.job.outcome"] == "succeeded"
    (body,) = [s for s in spans if s["name"] == "async body"]
    assert body["parent_id"] == run_async["span_id"]
