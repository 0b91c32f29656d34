"""Batches over HTTP: GET /v1/batches/{id} (JSON) and the dashboard's batch pages.

Read-only, as `hivejobs batch status`: the same App call (`batch_status`), whose errors
web/errors.py maps (404 for an unknown id, 422 for a malformed one). The pages are rendered
as the other dashboard pages (render.py) and stay live by re-fetching their fragment.
No `from __future__ import annotations` (threads.py).
"""

from typing import Annotated, Any

from litestar import MediaType, Request, Response, get
from litestar.datastructures import State
from litestar.params import Parameter

from hivejobs.client.app import App
from hivejobs.records import BatchStatus
from hivejobs.store.batches import BatchStore
from hivejobs.web.errors import ERROR_RESPONSES
from hivejobs.web.render import badge, esc, link, page, pretty, seg, table, when
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


def _html(request: Request[Any, Any, Any], title: str, body: str, only: bool) -> Response[str]:
    text = body if only else page(_base(request), title, body)
    return Response(text, media_type=MediaType.HTML)


def _base(request: Request[Any, Any, Any]) -> str:
    root = str(request.scope.get("root_path", "")) or str(request.app.state.base_path)
    return root.rstrip("/")


def _progress(b: BatchStatus) -> str:
    ended = b.total - b.pending
    share = 100 * ended / b.total if b.total else 100
    return (
        f'<progress class="batch-progress" max="{max(b.total, 1)}" value="{ended}"></progress>'
        f' <span class="muted">{ended} of {b.total} ended ({share:.0f}%)</span>'
    )


@get("/dashboard/batches", include_in_schema=False)
@threaded
def batches_page(request: Request[Any, Any, Any], state: State, fragment: bool = False) -> Any:
    base = _base(request)
    rows = BatchStore(_app(state).connections.read_store).recent(RECENT)
    cells = [
        [
            link(base, f"/dashboard/batches/{seg(b.id)}", b.id),
            badge(b.state),
            _progress(b),
            f"{b.succeeded} / {b.failed + b.cancelled + b.expired}",
            esc(b.on_complete or "-"),
            esc(when(b.created_at)),
        ]
        for b in rows
    ]
    headers = ["id", "state", "progress", "succeeded / not", "on_complete", "created"]
    return _html(request, "Batches", table(headers, cells, "no batches"), fragment)


@get("/dashboard/batches/{batch_id:str}", include_in_schema=False)
@threaded
def batch_page(
    request: Request[Any, Any, Any], state: State, batch_id: str, fragment: bool = False
) -> Any:
    base = _base(request)
    b = _app(state).batch_status(batch_id, 200)
    callbacks = [
        (b.on_complete, b.complete_job_id),
        (b.on_success, b.success_job_id),
    ]
    links = [
        link(base, f"/dashboard/jobs/{seg(name)}/{seg(job)}", job)
        if name and job
        else esc(name or "-")
        for name, job in callbacks
    ]
    facts = [
        ("state", badge(b.state)),
        ("progress", _progress(b)),
        ("succeeded", esc(b.succeeded)),
        ("failed", esc(b.failed)),
        ("cancelled", esc(b.cancelled)),
        ("expired", esc(b.expired)),
        ("on_complete", links[0]),
        ("on_success", links[1]),
        ("created", esc(when(b.created_at))),
        ("sealed", esc(when(b.sealed_at))),
        ("completed", esc(when(b.completed_at))),
    ]
    dl = "<dl>" + "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in facts) + "</dl>"
    failed = [
        [link(base, f"/dashboard/jobs/{seg(f.name)}/{seg(f.job_id)}", f.job_id), badge(f.state)]
        for f in b.failures
    ]
    body = (
        f"{dl}<h3>Data</h3><pre>{pretty(b.data)}</pre>"
        f"<h3>Not succeeded</h3>{table(['job', 'state'], failed, 'none')}"
    )
    return _html(request, f"Batch {batch_id}", body, fragment)


HANDLERS: list[Any] = [get_batch, batches_page, batch_page]
