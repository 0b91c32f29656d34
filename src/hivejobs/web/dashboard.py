"""The dashboard: server-rendered pages (render.py), live by re-fetching their own fragment.

Pages: job types with throughput charts (and which are paused), a type's jobs by state (and
its Pause/Resume button), one job, failed jobs with bulk replay/cancel, chains and one chain's
DAG, workers and the coordinator. Lists are keyset pages (store/dashboard.py): no OFFSET, no
count over the archive; one chain's jobs and job log come in numbered pages (bounded by the
chain's own size). Nothing here writes: the buttons call the JSON API, whose admin guard
applies (a read-only sign-in sees the API's 403 in the page's flash line).
"""

from collections import Counter
from datetime import datetime
from typing import Annotated, Any

from litestar import MediaType, Request, Response, get, post
from litestar.datastructures import State
from litestar.enums import RequestEncodingType
from litestar.params import Body, Parameter, QueryParameter
from litestar.response import Redirect

from hivejobs.client.app import App
from hivejobs.display import exception_line
from hivejobs.errors import JobNotFound
from hivejobs.records import ChainJobStatus, JobSummary
from hivejobs.store.dashboard import DashboardStore, ListName
from hivejobs.store.flow import FlowSettings, FlowStore
from hivejobs.store.sequence import Hold, SequenceStore
from hivejobs.web.auth import (
    SESSION_COOKIE,
    Sessions,
    Tokens,
    check_throttle,
    client_address,
    failed_authentication,
)
from hivejobs.web.fair import keys_section
from hivejobs.web.fleet import job_type_rows, read_throughput
from hivejobs.web.render import (
    badge,
    dag,
    esc,
    link,
    page,
    pretty,
    progress_bar,
    seconds,
    seg,
    sparkline,
    table,
    when,
)
from hivejobs.web.threads import threaded

PAGE = 50
# The chain page: jobs and job-log tries per page, and the largest chain drawn as a graph.
CHAIN_PAGE = 100
DAG_MAX_JOBS = 200
WINDOW_MIN = 60

Fragment = Annotated[bool, QueryParameter(name="fragment")]
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


def _base(request: Request[Any, Any, Any]) -> str:
    root = str(request.scope.get("root_path", "")) or str(request.app.state.base_path)
    return root.rstrip("/")


def _html(request: Request[Any, Any, Any], title: str, fragment: str, only: bool) -> Response[str]:
    body = fragment if only else page(_base(request), title, fragment)
    return Response(body, media_type=MediaType.HTML)


def _job_rows(base: str, rows: list[JobSummary], pick: bool) -> list[list[str]]:
    out = []
    for r in rows:
        cells = [f'<input type="checkbox" class="pick" value="{esc(r.id)}">'] if pick else []
        cells += [
            link(base, f"/dashboard/jobs/{seg(r.name)}/{seg(r.id)}", r.id),
            esc(r.name),
            badge(r.state),
            f"{r.attempt}/{r.attempts}",
            esc(when(r.finished_at or r.started_at or r.run_at)),
            f'<span class="muted error-line">{esc(r.error_line)}</span>' if r.error else "",
        ]
        out.append(cells)
    return out


def _job_list(
    base: str, path: str, rows: list[JobSummary], nxt: str | None, **q: str | None
) -> str:
    bulk = (
        f'<button data-bulk="replay" data-url="{esc(base)}/v1/bulk">Replay selected</button>'
        f'<button data-bulk="cancel" data-url="{esc(base)}/v1/bulk">Cancel selected</button>'
    )
    headers = ["", "id", "type", "state", "attempt", "at", "error"]
    more = link(base, path, "next page", after=nxt, **q) if nxt else ""
    return bulk + table(headers, _job_rows(base, rows, True), "no jobs") + more


@get("/dashboard", include_in_schema=False)
@threaded
def overview(request: Request[Any, Any, Any], state: State, fragment: Fragment = False) -> Any:
    app = _app(state)
    base = _base(request)
    # The window the CLI's `hivejobs jobs` counts over (its "failed 1h").
    tp = read_throughput(app, WINDOW_MIN)
    live = app.store.live_pools(app.settings.stuck_after_s)
    rows = []
    for t in job_type_rows(app):
        series = tp.series.get(t.name, {"succeeded": [0] * WINDOW_MIN, "failed": [0] * WINDOW_MIN})
        # Queued jobs of a type no live pool serves wait for ever: said on its row.
        served = str(live[t.name]) if live.get(t.name) else badge("no live worker")
        rows.append(
            [
                link(base, f"/dashboard/types/{seg(t.name)}", t.name),
                link(base, f"/dashboard/types/{seg(t.name)}", t.queued, state="queued"),
                link(base, f"/dashboard/types/{seg(t.name)}", t.scheduled, state="scheduled"),
                link(base, f"/dashboard/types/{seg(t.name)}", t.running, state="running"),
                str(sum(series["succeeded"])),
                link(base, "/dashboard/failed", sum(series["failed"]), type=t.name),
                sparkline(series["succeeded"], series["failed"]),
                served,
                _paused(t.paused_at),
            ]
        )
    headers = ["type", "queued", "scheduled", "running", "succeeded 1h", "failed 1h"]
    headers += ["finished per minute, last hour", "live pools", "paused"]
    return _html(request, "Job types", table(headers, rows, "no job types yet"), fragment)


def _paused(paused_at: datetime | None) -> str:
    """A paused type's badge, with the time it was paused; '-' when it runs."""
    if paused_at is None:
        return "-"
    return f"{badge('paused')} since {esc(when(paused_at))}"


@get("/dashboard/types/{name:str}", include_in_schema=False)
@threaded
def type_jobs(
    request: Request[Any, Any, Any],
    state: State,
    name: str,
    list_state: Annotated[ListName, QueryParameter(name="state")] = "queued",
    after: After = None,
    fragment: Fragment = False,
) -> Any:
    base = _base(request)
    app = _app(state)
    rows, nxt = DashboardStore(app.store).jobs(list_state, name, after, PAGE)
    path = f"/dashboard/types/{seg(name)}"
    tabs = " | ".join(
        link(base, path, s, state=s)
        for s in ("queued", "scheduled", "running", "failed", "finished")
    )
    body = _flow_controls(base, name, FlowStore(app.store).settings(name))
    body += keys_section(app, name)  # fair_by types only (web/fair.py)
    body += _held_keys(base, name, SequenceStore(app.store).holds(name))
    body += f"<p>{tabs}</p>" + _job_list(base, path, rows, nxt, state=list_state)
    return _html(request, f"{name}: {list_state}", body, fragment)


def _flow_controls(base: str, name: str, flow: FlowSettings) -> str:
    """A type's pause notice and its Pause or Resume button, which calls the
    JSON API like every dashboard button (admin token, web/flow.py); and its scale if set."""
    url = f"{esc(base)}/v1/jobtypes/{esc(seg(name))}"
    if flow.paused:
        out = (
            f'<p class="paused-notice">{_paused(flow.paused_at)} nothing new starts until '
            f"resumed (here, or <code>hivejobs resume {esc(name)}</code>); running jobs "
            "finish.</p>"
            f'<button id="resume" data-url="{url}/resume">Resume {esc(name)}</button>'
        )
    else:
        out = f'<button id="pause" data-url="{url}/pause">Pause {esc(name)}</button>'
    if flow.concurrency is not None:
        out += (
            f'<p class="scaled">Scaled to {flow.concurrency} runner threads per pool process '
            f"(<code>hivejobs scale {esc(name)} default</code> goes back to the code's).</p>"
        )
    return out


def _held_keys(base: str, name: str, holds: list[Hold]) -> str:
    """A sequenced type's keys held by a job failed for good (sequence.py): which, by which
    job, since when, why, and the two ways on. Nothing for a type without holds."""
    if not holds:
        return ""
    rows = [
        [
            esc(h.key),
            link(base, f"/dashboard/jobs/{seg(name)}/{seg(h.job_id)}", h.job_id),
            when(h.held_at),
            esc(exception_line(h.error)[:120]),
        ]
        for h in holds
    ]
    return (
        f'<p class="held-notice">{len(holds)} key(s) held: nothing of a held key starts until '
        f"its failed job is replayed (it runs first) or the key released "
        f"(<code>hivejobs keys {esc(name)} --release KEY</code>).</p>"
        + table(["key", "held by", "since", "error"], rows, "")
    )


@get("/dashboard/failed", include_in_schema=False)
@threaded
def failed(
    request: Request[Any, Any, Any],
    state: State,
    job_type: Annotated[str | None, QueryParameter(name="type")] = None,
    after: After = None,
    fragment: Fragment = False,
) -> Any:
    base = _base(request)
    rows, nxt = DashboardStore(_app(state).store).jobs("failed", job_type, after, PAGE)
    body = _job_list(base, "/dashboard/failed", rows, nxt, type=job_type)
    return _html(request, "Failed jobs", body, fragment)


@get("/dashboard/jobs/{name:str}/{job_id:str}", include_in_schema=False)
@threaded
def job_page(
    request: Request[Any, Any, Any],
    state: State,
    name: str,
    job_id: str,
    fragment: Fragment = False,
) -> Any:
    app, base = _app(state), _base(request)
    info = app.get_job(job_id)
    if info.name != name:
        raise JobNotFound(job_id)
    url = f"{esc(base)}/v1/jobs/{esc(seg(name))}/{esc(seg(job_id))}"
    buttons = ""
    if info.state in ("scheduled", "queued", "running"):
        buttons += f'<button id="cancel" data-method="DELETE" data-url="{url}">Cancel</button>'
    else:
        buttons += f'<button id="replay" data-url="{url}/replay">Replay</button>'
    facts = [
        ("state", badge(info.state)),
        ("type", esc(info.name)),
        ("attempt", f"{info.attempt} of {info.attempts}"),
        ("priority", esc(info.priority)),
        ("delivery", esc(info.delivery)),
        ("created", esc(when(info.created_at))),
        ("due", esc(when(info.run_at))),
        ("started", esc(when(info.started_at))),
        ("finished", esc(when(info.finished_at))),
        ("waited", esc(seconds(info.run_at, info.started_at))),
        ("ran", esc(seconds(info.started_at, info.finished_at))),
        ("expires", esc(when(info.expires_at))),
    ]
    dl = "<dl>" + "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in facts) + "</dl>"
    bar = progress_bar(url, info.state, app.progress(job_id))
    body = f"{buttons}{dl}{bar}<h3>Payload</h3><pre>{pretty(info.payload)}</pre>"
    if info.error:
        body += f'<h3>Error</h3><pre class="error">{esc(info.error)}</pre>'
    if info.result is not None:
        body += f"<h3>Result</h3><pre>{pretty(info.result)}</pre>"
    return _html(request, f"Job {job_id}", body, fragment)


@get("/dashboard/chains", include_in_schema=False)
@threaded
def chains(
    request: Request[Any, Any, Any], state: State, after: After = None, fragment: Fragment = False
) -> Any:
    base = _base(request)
    rows, nxt = DashboardStore(_app(state).store).chains(after, PAGE)
    cells = [
        [
            link(base, f"/dashboard/chains/{seg(c.id)}", c.id),
            esc(c.name),
            badge(c.state),
            f"{c.succeeded}/{c.jobs}",
            esc(when(c.created_at)),
            esc(when(c.finished_at)),
        ]
        for c in rows
    ]
    more = link(base, "/dashboard/chains", "next page", after=nxt) if nxt else ""
    body = table(["id", "name", "state", "done", "created", "finished"], cells, "no chains") + more
    return _html(request, "Chains", body, fragment)


@get("/dashboard/chains/{request_id:str}", include_in_schema=False)
@threaded
def chain_page(
    request: Request[Any, Any, Any],
    state: State,
    request_id: str,
    page: ChainPageNumber = 1,
    fragment: Fragment = False,
) -> Any:
    """A chain: its DAG (up to DAG_MAX_JOBS jobs), then CHAIN_PAGE jobs and CHAIN_PAGE tries
    of its log per page: a 20,000-job chain re-fetched every two seconds stays a small page."""
    app, base = _app(state), _base(request)
    status = app.chain_status(request_id)
    log, log_total = DashboardStore(app.store).chain_log(
        request_id, (page - 1) * CHAIN_PAGE, CHAIN_PAGE
    )
    stop = ""
    if status.state in ("pending", "running", "suspended") and not status.stop_requested:
        url = f"{esc(base)}/v1/chains/{esc(seg(request_id))}/stop"
        stop = f'<button id="stop" data-url="{url}">Stop chain</button>'
    shown = status.jobs[(page - 1) * CHAIN_PAGE : page * CHAIN_PAGE]
    jobs = [
        [
            esc(j.key),
            esc(j.type),
            badge(j.state),
            f"{j.try_}/{j.tries}",
            esc(j.status or ""),
            link(base, f"/dashboard/jobs/{seg(j.type)}/{seg(j.job_id)}", j.job_id)
            if j.job_id
            else "-",
            esc(j.added_by or ""),
        ]
        for j in shown
    ]
    entries = [
        [
            esc(e.key),
            str(e.try_),
            badge(e.state),
            esc(when(e.finished_at)),
            # A traceback keeps its lines and indentation, as on the job's own page.
            f'<pre class="error">{esc(e.error)}</pre>' if e.error else "",
        ]
        for e in log
    ]
    pages = max(1, -(-max(len(status.jobs), log_total) // CHAIN_PAGE))
    path = f"/dashboard/chains/{seg(request_id)}"
    pager = _pager(base, path, page, pages)
    body = (
        f"<p>{esc(status.name)} {badge(status.state)} created {esc(when(status.created_at))}</p>"
        f"{stop}{_chain_graph(base, status.jobs)}{pager}"
        + table(["key", "type", "state", "try", "status", "job", "added by"], jobs)
        + f"<h3>Job log ({log_total} tries)</h3>"
        + table(["key", "try", "state", "finished", "error"], entries, "no tries yet")
        + pager
    )
    return _html(request, f"Chain {request_id}", body, fragment)


def _chain_graph(base: str, jobs: list[ChainJobStatus]) -> str:
    """The DAG while it is readable; above that, the jobs counted by state."""
    if len(jobs) <= DAG_MAX_JOBS:
        return dag(base, jobs)
    counts = Counter(j.state for j in jobs)
    states = ", ".join(f"{n} {esc(s)}" for s, n in sorted(counts.items()))
    return f"<p>{len(jobs)} jobs: {states} (the graph is drawn up to {DAG_MAX_JOBS} jobs)</p>"


def _pager(base: str, path: str, page: int, pages: int) -> str:
    if pages <= 1:
        return ""
    parts = [f"page {page} of {pages}"]
    if page > 1:
        parts.append(link(base, path, "previous page", page=str(page - 1)))
    if page < pages:
        parts.append(link(base, path, "next page", page=str(page + 1)))
    return f'<p class="pager">{" · ".join(parts)}</p>'


@get("/dashboard/workers", include_in_schema=False)
@threaded
def workers_page(request: Request[Any, Any, Any], state: State, fragment: Fragment = False) -> Any:
    app = _app(state)
    dash = DashboardStore(app.store)
    lead = dash.leader()
    rows = [
        [
            esc(w.id[:8]),
            esc(w.host),
            str(w.pid),
            esc(w.role) + (" (leader)" if lead and lead.valid and lead.holder == w.id else ""),
            esc(w.pool or "-"),
            esc(when(w.started_at)),
            f'<span class="hb">{w.heartbeat_age_s:.1f} s ago</span>',
            str(w.running),
        ]
        for w in app.store.workers()
    ]
    headers = ["id", "host", "pid", "role", "pool", "started", "heartbeat", "running"]
    if lead is None or lead.holder is None:
        coord = "<p>No coordinator holds the lease.</p>"
    else:
        coord = (
            f"<p>Leader {esc(lead.holder[:8])}, term {lead.term}, lease "
            f"{'valid' if lead.valid else 'expired'} ({lead.expires_in_s:.1f} s left)</p>"
        )
    services = table(["service", "what it does"], [[esc(n), esc(d)] for n, d in SERVICES])
    body = table(headers, rows, "no worker running") + "<h3>Coordinator</h3>" + coord + services
    return _html(request, "Workers", body, fragment)


@get("/dashboard/login", opt={"public": True}, include_in_schema=False)
@threaded
def login_form(request: Request[Any, Any, Any]) -> Response[str]:
    form = (
        f'<form method="post" action="{esc(_base(request))}/dashboard/login">'
        '<input type="password" name="token" placeholder="token" autofocus> '
        '<button id="signin">Sign in</button></form>'
    )
    return Response(page(_base(request), "Sign in", form, live=False), media_type=MediaType.HTML)


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
    base = _base(request)
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
    base = _base(request)
    response = Redirect(base + "/dashboard/login", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path=base or "/")
    return response


@get("/", include_in_schema=False)
@threaded
def root(request: Request[Any, Any, Any]) -> Redirect:
    return Redirect(_base(request) + "/dashboard")


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
