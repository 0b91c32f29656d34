"""tracing.py without servers: the API's own providers make no tracer (the no-op path), and
a stored trace context reads back as the span that wrote it; a malformed one as none."""

from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import NoOpTracerProvider, ProxyTracerProvider

from hivejobs.tracing import extracted, traceparent_of, tracer_of


@pytest.mark.parametrize("provider", [ProxyTracerProvider(), NoOpTracerProvider()])
def test_the_apis_own_providers_make_no_tracer(provider: trace.TracerProvider) -> None:
    """The check an untraced enqueue or attempt pays: with either, no span is made."""
    assert tracer_of(provider) is None


def test_a_stored_context_reads_back_as_the_span_that_wrote_it() -> None:
    found = tracer_of(TracerProvider())
    assert found is not None
    with found.start_as_current_span("enqueue") as span:
        stored = traceparent_of(span)
    assert stored is not None
    ctx = extracted(stored)
    assert ctx is not None
    read = trace.get_current_span(ctx).get_span_context()
    assert (read.trace_id, read.span_id) == (
        span.get_span_context().trace_id,
        span.get_span_context().span_id,
    )
    assert read.is_remote


@pytest.mark.parametrize("stored", [None, "", "garbage", "00-" + "0" * 32 + "-" + "0" * 16 + "-01"])
def test_a_missing_or_malformed_context_is_none(stored: str | None) -> None:
    """The attempt then starts a trace of its own instead of failing."""
    assert extracted(stored) is None
