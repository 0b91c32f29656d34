"""The dashboard: server-rendered pages, live by re-fetching their own fragment. Handlers read
records and pass them to a Jinja2 template of templates/ (render.page), which autoescapes
every value: no HTML is built here.

Pages: job types with throughput charts (and which are paused), a type's jobs by state (and
its Pause/Resume button), one job, failed jobs with bulk replay/cancel, chains and one chain's
DAG, workers and the coordinator. Lists are keyset pages (store/dashboard.py): no OFFSET, no
count over the archive; one chain's jobs and job log come in numbered pages (bounded by the
chain's own size). Nothing here writes: the buttons call the JSON API, whose admin guard
applies (a read-only sign-in sees the API's 403 in the page's flash line).
"""

from collections import Counter
from dataclasses import dataclass
from typing import Annotated, Any

from litestar import Request, get, post
from litestar.datastructures import State
from litestar.enums import RequestEncodingType
from litestar.params import Body, FromPath, Parameter, QueryParameter
from litestar.response import Redirect, Template

from hivejobs.client.app import App
from hivejobs.errors import JobNotFound
from hivejobs.records.chains import ChainJobStatus
from hivejobs.store.dashboard import DashboardStore, ListName
from hivejobs.store.flow import FlowStore
from hivejobs.store.sequence import SequenceStore
from hivejobs.web import render
from hivejobs.web.auth import (
    SESSION_COOKIE,
    Sessions,
    Tokens,
    check_throttle,
    client_address,
    failed_authentication,
)
from hivejobs.web.fair import fair_keys
from hivejobs.web.fleet import job_type_rows, read_throughput
from hivejobs.web.render import Chart, Fragment
from hivejobs.web.schemas import JobTypeOut
from hivejobs.web.threads import threaded

PAGE = 50
# The chain page: jobs and job-log tries per page, and the largest chain drawn as a graph.
CHAIN_PAGE = 100
DAG_MAX_JOBS = 200
WINDOW_MIN = 60

After = Annotated[str | None, Parameter(max_length=600)]
ChainPageNumber = Annotated[int, QueryParameter(ge=1, le=1_000_000)]
SERVICES = (
    ("traverser", "runs chains: starts jobs whose predecessors succeeded"),
    ("promoter", "queues scheduled and retry-delayed jobs when due; ends expired ones"),
    ("rescuer", "requeues or fails the jobs of processes whose heartbeat stopped"),
    ("callback timeouts", "ends callback jobs whose status callback never came"),
    ("reconciler", "re-pushes queued ids that Redis lost"),
    ("gauges", "measures queue depth and jobs in flight"),
    ("compactor", "gives a drained hot table's space back"),
)


def _app(state: State) -> App:
    app: App = state.hivejobs
    return app


@dataclass(frozen=True)
class TypeRow:
    """A job type on the overview: its live counts, its last hour, its live pools."""

    info: JobTypeOut
    succeeded: int
    failed: int
    chart: Chart
    pools: int


@get("/dashboard", include_in_schema=False)
@threaded
def overview(request: Request[Any, Any, Any], state: State, fragment: Fragment = False) -> Template:
    app = _app(state)
    # The window the CLI's `hivejobs jobs` counts over (its "failed 1h").
    tp = read_throughput(app, WINDOW_MIN)
    live = app.connections.store.live_pools(app.settings.stuck_after_s)
    rows = []
    for t in job_type_rows(app):
        series = tp.series.get(t.name, {"succeeded": [0] * WINDOW_MIN, "failed": [0] * WINDOW_MIN})
        ok, failed = series["succeeded"], series["failed"]
        rows.append(TypeRow(t, sum(ok), sum(failed), render.chart(ok, failed), live.get(t.name, 0)))
    return render.page(request, "overview.html", "Job types", fragment, types=rows)


@get("/dashboard/types/{name:str}", include_in_schema=False)
@threaded
def type_jobs(
    request: Request[Any, Any, Any],
    state: State,
    name: FromPath[str],
    list_state: Annotated[ListName, QueryParameter(name="state")] = "queued",
    after: After = None,
    fragment: Fragment = False,
) -> Template:
    app = _app(state)
    rows, nxt = DashboardStore(app.connections.store).jobs(list_state, name, after, PAGE)
    fair_by, keys = fair_keys(app, name)  # fair_by types only (web/fair.py)
    return render.page(
        request,
        "type_jobs.html",
        f"{name}: {list_state}",
        fragment,
        name=name,
        list_state=list_state,
        rows=rows,
        nxt=nxt,
        flow=FlowStore(app.connections.store).settings(name),
        fair_by=fair_by,
        fair_keys=keys,
        # A sequenced type's keys held by a job failed for good (sequence.py).
        holds=SequenceStore(app.connections.store).holds(name),
    )


@get("/dashboard/failed", include_in_schema=False)
@threaded
def failed(
    request: Request[Any, Any, Any],
    state: State,
    job_type: Annotated[str | None, QueryParameter(name="type")] = None,
    after: After = None,
    fragment: Fragment = False,
) -> Template:
    rows, nxt = DashboardStore(_app(state).connections.store).jobs("failed", job_type, after, PAGE)
    context = {"rows": rows, "nxt": nxt, "job_type": job_type}
    return render.page(request, "failed.html", "Failed jobs", fragment, **context)


@get("/dashboard/jobs/{name:str}/{job_id:str}", include_in_schema=False)
@threaded
def job_page(
    request: Request[Any, Any, Any],
    state: State,
    name: FromPath[str],
    job_id: FromPath[str],
    fragment: Fragment = False,
) -> Template:
    app = _app(state)
    info = app.get_job(job_id)
    if info.name != name:
        raise JobNotFound(job_id)
    progress = app.progress(job_id)
    return render.page(request, "job.html", f"Job {job_id}", fragment, info=info, progress=progress)


@get("/dashboard/chains", include_in_schema=False)
@threaded
def chains(
    request: Request[Any, Any, Any], state: State, after: After = None, fragment: Fragment = False
) -> Template:
    rows, nxt = DashboardStore(_app(state).connections.store).chains(after, PAGE)
    return render.page(request, "chains.html", "Chains", fragment, rows=rows, nxt=nxt)


@get("/dashboard/chains/{request_id:str}", include_in_schema=False)
@threaded
def chain_page(
    request: Request[Any, Any, Any],
    state: State,
    request_id: FromPath[str],
    page: ChainPageNumber = 1,
    fragment: Fragment = False,
) -> Template:
    """A chain: its DAG (up to DAG_MAX_JOBS jobs), then CHAIN_PAGE jobs and CHAIN_PAGE tries
    of its log per page: a 20,000-job chain re-fetched every two seconds stays a small page."""
    app = _app(state)
    status = app.chain_status(request_id)
    log, log_total = DashboardStore(app.connections.store).chain_log(
        request_id, (page - 1) * CHAIN_PAGE, CHAIN_PAGE
    )
    shown = status.jobs[(page - 1) * CHAIN_PAGE : page * CHAIN_PAGE]
    # Above DAG_MAX_JOBS the graph is unreadable: the jobs counted by state instead.
    counts = [] if len(status.jobs) <= DAG_MAX_JOBS else _counts(status.jobs)
    return render.page(
        request,
        "chain.html",
        f"Chain {request_id}",
        fragment,
        chain_id=request_id,
        status=status,
        can_stop=status.state in ("pending", "running", "suspended") and not status.stop_requested,
        dag_max=DAG_MAX_JOBS,
        counts=counts,
        shown=shown,
        log=log,
        log_total=log_total,
        page=page,
        pages=max(1, -(-max(len(status.jobs), log_total) // CHAIN_PAGE)),
    )


def _counts(jobs: list[ChainJobStatus]) -> list[tuple[str, int]]:
    return sorted(Counter(j.state for j in jobs).items())


@get("/dashboard/workers", include_in_schema=False)
@threaded
def workers_page(
    request: Request[Any, Any, Any], state: State, fragment: Fragment = False
) -> Template:
    app = _app(state)
    return render.page(
        request,
        "workers.html",
        "Workers",
        fragment,
        workers=app.connections.store.workers(),
        leader=DashboardStore(app.connections.store).leader(),
        services=SERVICES,
    )


@get("/dashboard/login", opt={"public": True}, include_in_schema=False)
@threaded
def login_form(request: Request[Any, Any, Any]) -> Template:
    return render.page(request, "login.html", "Sign in", False, live=False)


@post(
    "/dashboard/login",
    opt={"public": True, "form": True},
    status_code=303,
    include_in_schema=False,
)
@threaded
def login(
    request: Request[Any, Any, Any],
    state: State,
    data: Annotated[dict[str, str], Body(media_type=RequestEncodingType.URL_ENCODED)],
) -> Redirect:
    """Exchanges a token for a session cookie: signed, expiring, HttpOnly, SameSite=Strict,
    scoped to where the dashboard is mounted. Wrong tokens count against the client as on
    the API (auth.Throttle)."""
    base = render.base(request)
    tokens: Tokens = state.tokens
    if tokens.open:
        return Redirect(base + "/dashboard", status_code=303)
    client = client_address(request)
    check_throttle(state.throttle, client)
    role = tokens.role_of(data.get("token", ""))
    if role is None:
        failed_authentication(state.throttle, client, request.url.path)
        return Redirect(base + "/dashboard/login", status_code=303)
    if role == "callback":  # posts its type's callbacks over the API, never a session
        return Redirect(base + "/dashboard/login", status_code=303)
    sessions: Sessions = state.sessions
    response = Redirect(base + "/dashboard", status_code=303)
    response.set_cookie(
        SESSION_COOKIE,
        sessions.issue(role),
        max_age=int(sessions.lifetime_s),
        path=base or "/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return response


@post(
    "/dashboard/logout",
    opt={"public": True, "form": True},
    status_code=303,
    include_in_schema=False,
)
@threaded
def logout(request: Request[Any, Any, Any]) -> Redirect:
    base = render.base(request)
    response = Redirect(base + "/dashboard/login", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path=base or "/")
    return response


@get("/", include_in_schema=False)
@threaded
def root(request: Request[Any, Any, Any]) -> Redirect:
    return Redirect(render.base(request) + "/dashboard")


HANDLERS: list[Any] = [
    overview,
    type_jobs,
    failed,
    job_page,
    chains,
    chain_page,
    workers_page,
    login_form,
    login,
    logout,
    root,
]
