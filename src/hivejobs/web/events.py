"""GET /v1/jobs/{name}/{id}/events: a job's stream (app.astream) as server-sent events.

One SSE message per JobEvent: `event:` its kind (progress, emit, end), `data:` the event as
JSON. The last stored progress comes first, the `end` event last, then the response ends.
A comment line every PING_S keeps proxies from cutting a quiet stream and lets the server
notice a client that left (the next write fails) instead of holding its Redis subscription
and LISTEN session until the job ends. Read access (a read token or a dashboard session),
like every other GET: the guard in asgi.py applies. Nothing here touches SQL.
No `from __future__ import annotations` (Litestar reads the handler's annotations).
"""

import asyncio
from collections.abc import AsyncIterator
from typing import Annotated, Any

import msgspec
from litestar import get
from litestar.datastructures import State
from litestar.openapi.datastructures import ResponseSpec
from litestar.params import Parameter
from litestar.response import ServerSentEvent, ServerSentEventMessage

from hivejobs.client.app import App
from hivejobs.errors import JobNotFound
from hivejobs.records.events import JobEvent
from hivejobs.web.errors import ERROR_RESPONSES

PING_S = 15.0


class EventMessage(msgspec.Struct, kw_only=True):
    """One server-sent event as the OpenAPI document describes it (the wire format is SSE's
    `event:` and `data:` lines, not this JSON)."""

    event: Annotated[str, msgspec.Meta(description="progress, emit or end")]
    data: Annotated[
        str,
        msgspec.Meta(
            description="the event as JSON: kind, job_id, attempt; done, total, note "
            "(progress); data, dropped (emit); state (end)",
            extra_json_schema={"contentMediaType": "application/json"},
        ),
    ]


Name = Annotated[str, Parameter(description="job type", min_length=1, max_length=64)]
JobId = Annotated[str, Parameter(description="job id", min_length=1, max_length=255)]


@get(
    "/v1/jobs/{name:str}/{job_id:str}/events",
    operation_id="job_events",
    summary="A job's progress, partial results and end, as server-sent events",
    description="`text/event-stream` until the job ends. Each message's `event` is `progress` "
    "(done, total, note), `emit` (a partial result in `data`, `dropped`: emits dropped by the "
    "job's rate limit before it) or `end` (the final `state`, always last); its `data` is the "
    "event as JSON. A client that connects late gets the last progress first; one that "
    "connects after the end gets the last progress and the end at once.",
    responses={
        **ERROR_RESPONSES(404),
        200: ResponseSpec(
            data_container=EventMessage,
            description="the stream (text/event-stream)",
            media_type="text/event-stream",
        ),
    },
    media_type="text/event-stream",
)
async def job_events(state: State, name: Name, job_id: JobId) -> ServerSentEvent:
    app: App = state.hivejobs
    info = await app.aget_job(job_id)  # 404 before the stream starts
    if info.name != name:
        raise JobNotFound(job_id)  # not found under another type's path
    return ServerSentEvent(_messages(app.astream(job_id)))


async def _messages(events: AsyncIterator[JobEvent]) -> AsyncIterator[ServerSentEventMessage]:
    """The stream's events as SSE messages, with a ping comment every PING_S of quiet. The
    next event is one task awaited across pings (cancelling it would end the stream)."""
    step: asyncio.Future[JobEvent] | None = None
    try:
        while True:
            step = asyncio.ensure_future(anext(events))
            while not (await asyncio.wait({step}, timeout=PING_S))[0]:
                yield ServerSentEventMessage(comment="ping")
            try:
                event = step.result()
            except StopAsyncIteration:
                return
            yield ServerSentEventMessage(event=event.kind, data=msgspec.json.encode(event).decode())
    finally:
        # The client left (or the stream ended): the pending read first, then the stream's
        # subscription and LISTEN session.
        if step is not None and not step.done():
            step.cancel()
            await asyncio.gather(step, return_exceptions=True)
        aclose: Any = getattr(events, "aclose", None)
        if aclose is not None:
            await aclose()


HANDLERS: list[Any] = [job_events]
