"""OpenTelemetry spans: one for each enqueue (a child of the caller's current span), one for
each attempt (a child of, and linked to, the span that enqueued the job), a chain as one trace.

The enqueue span's context travels in the job row (`trace_context`, a W3C `traceparent`
value: migration 0021), never in the payload, so re-enqueueing an id compares payloads as
before. A chain's span context is stored on the chain and copied into each try's row by the
traverser: every job of a chain runs in the chain's trace.

Needs only `opentelemetry-api` (`hivejobs[otel]`), and nothing at all without it: with the
package missing, or with no SDK's TracerProvider set (the API's default proxy or its no-op
provider), every call here is one isinstance check and the row's column stays NULL. The
user configures the SDK; hivejobs never imports it. In `hivejobs run` the pool processes are
forked: `App.on_process_start` is where an exporter that holds sockets or threads is set up
in each of them, and a pool flushes the provider before it exits (`flush`), since a forked
child ends with os._exit and the SDK's atexit shutdown never runs there.

Never raises into the caller because of tracing itself, and never records payloads.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import msgspec
from loguru import logger

from hivejobs.records.jobs import ClaimedJob, Completion, NewJob

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, Tracer, TracerProvider

try:
    from opentelemetry import trace
    from opentelemetry.trace import Link, SpanKind, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    API = True
    _PROPAGATOR = TraceContextTextMapPropagator()
except ImportError:  # hivejobs without the otel extra: nothing is traced
    API = False

# Attribute names, one namespace: what the dashboards of a tracing backend filter on.
TYPE = "hivejobs.job.type"
ID = "hivejobs.job.id"
COUNT = "hivejobs.job.count"
ATTEMPT = "hivejobs.job.attempt"
DELIVERY = "hivejobs.job.delivery"
OUTCOME = "hivejobs.job.outcome"
CHAIN_ID = "hivejobs.chain.id"
CHAIN_NAME = "hivejobs.chain.name"

# Outcomes that end an attempt in error (a retry is still a failed attempt).
_ERROR_OUTCOMES = frozenset({"retry", "failed"})
_cached: tuple[object, Tracer | None] = (None, None)


def tracer() -> Tracer | None:
    """The hivejobs tracer of the configured SDK, or None while none is configured: the one
    check an untraced enqueue or attempt pays."""
    if not API:
        return None
    global _cached
    provider = trace.get_tracer_provider()
    cached_provider, cached = _cached
    if provider is cached_provider:
        return cached
    found = tracer_of(provider)
    _cached = (provider, found)
    return found


def tracer_of(provider: TracerProvider) -> Tracer | None:
    """None for the API's own providers (the proxy before any SDK is set, the no-op one):
    their spans would record nothing, so no span and no context are made at all."""
    if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        return None
    return provider.get_tracer("hivejobs")


# -- enqueue ---------------------------------------------------------------------------------


def enqueueing(job: NewJob) -> contextlib.AbstractContextManager[NewJob]:
    """`with enqueueing(job) as job:` the insert runs in the enqueue span, and the job
    carries that span's context into its row. Untraced: the same job, no span."""
    found = tracer()
    if found is None:
        return contextlib.nullcontext(job)
    return _enqueueing(found, job)


@contextlib.contextmanager
def _enqueueing(found: Tracer, job: NewJob) -> Iterator[NewJob]:
    attributes: dict[str, str | int] = {TYPE: job.name, ID: job.id, DELIVERY: job.delivery}
    with _producer(found, f"enqueue {job.name}", attributes) as traceparent:
        yield msgspec.structs.replace(job, trace_context=traceparent)


def enqueueing_many(jobs: Sequence[NewJob]) -> contextlib.AbstractContextManager[list[NewJob]]:
    """`enqueueing` for enqueue_many: one span for the batch, whose context every job of it
    carries (each attempt links to the batch's span)."""
    found = tracer()
    if found is None or not jobs:
        return contextlib.nullcontext(list(jobs))
    return _enqueueing_many(found, jobs)


@contextlib.contextmanager
def _enqueueing_many(found: Tracer, jobs: Sequence[NewJob]) -> Iterator[list[NewJob]]:
    name = jobs[0].name
    attributes: dict[str, str | int] = {TYPE: name, COUNT: len(jobs), DELIVERY: jobs[0].delivery}
    with _producer(found, f"enqueue_many {name}", attributes) as traceparent:
        yield [msgspec.structs.replace(j, trace_context=traceparent) for j in jobs]


def submitting_chain(head: dict[str, Any]) -> contextlib.AbstractContextManager[dict[str, Any]]:
    """`with submitting_chain(head) as head:` the chain's row (`head`, as store/chains.py
    inserts it) carries the submit span's context: the root of the chain's jobs' spans."""
    found = tracer()
    if found is None:
        return contextlib.nullcontext(head)
    return _submitting_chain(found, head)


@contextlib.contextmanager
def _submitting_chain(found: Tracer, head: dict[str, Any]) -> Iterator[dict[str, Any]]:
    attributes: dict[str, str | int] = {
        CHAIN_ID: head["id"],
        CHAIN_NAME: head["name"],
        COUNT: head["jobs"],
    }
    with _producer(found, f"run_chain {head['name']}", attributes) as traceparent:
        yield {**head, "trace_context": traceparent}


@contextlib.contextmanager
def _producer(found: Tracer, name: str, attributes: dict[str, str | int]) -> Iterator[str | None]:
    """A PRODUCER span, current while the insert runs (a database instrumentation's spans
    are its children); an exception ends it in error and goes on."""
    with found.start_as_current_span(name, kind=SpanKind.PRODUCER, attributes=attributes) as span:
        yield traceparent_of(span)


def traceparent_of(span: Span) -> str | None:
    """The W3C `traceparent` of `span`; None for an invalid context. A span the sampler
    dropped still has one, with the sampled flag clear: the attempts then drop theirs too."""
    ctx = span.get_span_context()
    if not ctx.is_valid:
        return None
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


# -- attempts --------------------------------------------------------------------------------


class Attempt:
    """An attempt's span, or nothing (`UNTRACED`): `ended` sets the outcome on it."""

    __slots__ = ("span",)

    def __init__(self, span: Span | None) -> None:
        self.span = span

    def ended(self, completion: Completion) -> Completion:
        """Pass the completion through; on a span, say the outcome (an error for a failed
        or retried attempt, its description the error's last line)."""
        span = self.span
        if span is None:
            return completion
        span.set_attribute(OUTCOME, completion.outcome)
        if completion.outcome in _ERROR_OUTCOMES:
            last_line = (completion.error or "").strip().splitlines()[-1:] or [""]
            span.set_status(Status(StatusCode.ERROR, last_line[0][:500]))
        return completion


UNTRACED = Attempt(None)


def attempting(job: ClaimedJob) -> contextlib.AbstractContextManager[Attempt]:
    """`with attempting(job) as attempt:` the handler runs in the attempt's span (its own
    spans are children of it). Untraced: UNTRACED, no span."""
    found = tracer()
    if found is None:
        return contextlib.nullcontext(UNTRACED)
    return _attempting(found, job)


@contextlib.contextmanager
def _attempting(found: Tracer, job: ClaimedJob) -> Iterator[Attempt]:
    """A CONSUMER span, a child of the enqueue's span and linked to it too: the messaging
    conventions' link survives a backend that drops remote parents, and a chain's jobs, all
    children of the chain's span, stay one trace."""
    parent = extracted(job.trace_context)
    links = []
    if parent is not None:
        links.append(Link(trace.get_current_span(parent).get_span_context()))
    attributes: dict[str, str | int] = {
        TYPE: job.name,
        ID: job.id,
        ATTEMPT: job.attempt,
        DELIVERY: job.delivery,
    }
    # record_exception off: the executor never lets a handler's exception out of this block;
    # record_error notes it on the span where the executor catches it.
    with found.start_as_current_span(
        f"run {job.name}",
        context=parent,
        kind=SpanKind.CONSUMER,
        attributes=attributes,
        links=links,
        record_exception=False,
    ) as span:
        yield Attempt(span)


def extracted(traceparent: str | None) -> Context | None:
    """The Context of a stored traceparent; None when there is none or it is malformed."""
    if not traceparent:
        return None
    ctx = _PROPAGATOR.extract({"traceparent": traceparent})
    if not trace.get_current_span(ctx).get_span_context().is_valid:
        return None
    return ctx


def record_error(exc: BaseException) -> None:
    """Note a handler's exception on the current attempt's span (if it records)."""
    if not API:
        return
    span = trace.get_current_span()
    if span.is_recording():
        span.record_exception(exc)


# -- forked processes ------------------------------------------------------------------------


def flush(timeout_s: float = 2.0) -> None:
    """Export what the SDK still holds, before a forked process ends with os._exit (which
    skips the SDK's atexit shutdown: a batch processor's queue would be lost). Bounded: it
    runs after the process's jobs are written, between the shutdown timeout (25 s by
    default) and a platform's SIGKILL (30 s on Heroku)."""
    if tracer() is None:
        return
    provider = trace.get_tracer_provider()
    force_flush = getattr(provider, "force_flush", None)
    if force_flush is None:
        return
    try:
        if not force_flush(int(timeout_s * 1000)):
            logger.warning("spans not all exported before exit", timeout_s=timeout_s)
    except Exception as exc:  # an exporter's error must not change the process's exit
        logger.warning("spans not exported before exit", error=str(exc), type=type(exc).__name__)
