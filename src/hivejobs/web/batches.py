"""Batches over HTTP: GET /v1/batches/{id} (JSON) and the dashboard's batch pages.

Read-only, as `hivejobs batch status`: the same App call (`batch_status`), whose errors
web/errors.py maps (404 for an unknown id, 422 for a malformed one). The pages are rendered
as the other dashboard pages (templates/batches.html, batch.html) and stay live by
re-fetching their fragment.
No `from __future__ import annotations` (threads.py).
"""

from typing import Annotated, Any

from litestar import Request, get
from litestar.datastructures import State
from litestar.params import FromPath, Parameter
from litestar.response import Template

from hivejobs.client.app import App
from hivejobs.records.batches import BatchStatus
from hivejobs.store.batches import BatchStore
from hivejobs.web import render
from hivejobs.web.errors import ERROR_RESPONSES
from hivejobs.web.render import Fragment
from hivejobs.web.threads import threaded

BatchId = Annotated[str, Parameter(description="batch id", min_length=1, max_length=255)]
Failures = Annotated[int, Parameter(ge=0, le=10_000, description="failed jobs to list")]
RECENT = 50


def _app(state: State) -> App:
    app: App = state.hivejobs
    return app


@get(
    "/v1/batches/{batch_id:str}",
    operation_id="get_batch",
    summary="A batch: state, counters, callback jobs, the jobs that did not succeed",
    responses=ERROR_RESPONSES(404),
)
@threaded
def get_batch(state: State, batch_id: BatchId, failures: Failures = 1000) -> BatchStatus:
    return _app(state).batch_status(batch_id, failures)


@get("/dashboard/batches", include_in_schema=False)
@threaded
def batches_page(
    request: Request[Any, Any, Any], state: State, fragment: Fragment = False
) -> Template:
    rows = BatchStore(_app(state).connections.read_store).recent(RECENT)
    return render.page(request, "batches.html", "Batches", fragment, rows=rows)


@get("/dashboard/batches/{batch_id:str}", include_in_schema=False)
@threaded
def batch_page(
    request: Request[Any, Any, Any],
    state: State,
    batch_id: FromPath[str],
    fragment: Fragment = False,
) -> Template:
    b = _app(state).batch_status(batch_id, 200)
    return render.page(request, "batch.html", f"Batch {batch_id}", fragment, b=b)


HANDLERS: list[Any] = [get_batch, batches_page, batch_page]
