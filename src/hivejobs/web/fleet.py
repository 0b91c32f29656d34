"""The HTTP API's fleet views: job types with live counts, workers and the coordinator lease,
throughput per minute, /healthz and /metrics. Read-only; no SQL here (store/dashboard.py).

No `from __future__ import annotations`: see web/threads.py.
"""

import time
from typing import Annotated, Any

import msgspec
import redis
from litestar import Response, get
from litestar.datastructures import State
from litestar.params import Parameter
from litestar.response import Response as LitestarResponse

from hivejobs.client.app import App
from hivejobs.store.dashboard import DashboardStore
from hivejobs.store.flow import FlowStore
from hivejobs.web.api import PUBLIC, hj
from hivejobs.web.errors import ERROR_RESPONSES
from hivejobs.web.schemas import Health, JobTypeOut, LeaderOut, ThroughputOut, WorkerOut, WorkersOut
from hivejobs.web.threads import threaded
from hivejobs.worker.metrics_server import CONTENT_TYPE, Reused, render


@get(
    "/v1/jobtypes",
    summary="Job types and their live counts",
    operation_id="job_types",
    responses=ERROR_RESPONSES(),
)
@threaded
def job_types(state: State) -> list[JobTypeOut]:
    return job_type_rows(hj(state))


def job_type_rows(app: App) -> list[JobTypeOut]:
    """Declared types (the fleet's and this process's own) with their live counts."""
    counts = DashboardStore(app.connections.store).live_counts()
    paused = {p.name: p.paused_at for p in FlowStore(app.connections.store).paused()}
    declared = {t.name: t for t in app.connections.store.job_types()}
    for jt in app.types.values():  # this process's own types, even before a worker ran
        declared.setdefault(jt.name, jt.info())
    out = []
    for name in sorted(set(declared) | set(counts)):
        t = declared.get(name)
        c = counts.get(name, {})
        out.append(
            JobTypeOut(
                name=name,
                concurrency=t.concurrency if t else 0,
                processes=t.processes if t else 0,
                attempts=t.attempts if t else 0,
                delivery=t.delivery if t else "unknown",
                timeout_s=t.timeout_s if t else None,
                callback=t.callback if t else False,
                callback_timeout_s=t.callback_timeout_s if t else None,
                queued=c.get("queued", 0),
                scheduled=c.get("scheduled", 0),
                running=c.get("running", 0),
                paused=name in paused,
                paused_at=paused.get(name),
            )
        )
    return out


@get(
    "/v1/workers",
    summary="Worker processes, heartbeats, the leader",
    operation_id="workers",
    responses=ERROR_RESPONSES(),
)
@threaded
def workers(state: State) -> WorkersOut:
    app = hj(state)
    rows = [WorkerOut(**msgspec.structs.asdict(w)) for w in app.connections.store.workers()]
    lead = DashboardStore(app.connections.store).leader()
    leader = (
        LeaderOut(
            holder=lead.holder, term=lead.term, valid=lead.valid, expires_in_s=lead.expires_in_s
        )
        if lead is not None
        else None
    )
    return WorkersOut(workers=rows, leader=leader)


@get(
    "/v1/throughput",
    summary="Jobs finished per minute, per type",
    operation_id="throughput",
    responses=ERROR_RESPONSES(),
)
@threaded
def throughput(
    state: State, minutes: Annotated[int, Parameter(ge=1, le=120)] = 30
) -> ThroughputOut:
    return read_throughput(hj(state), minutes)


def read_throughput(app: App, minutes: int) -> ThroughputOut:
    now = int(time.time() // 60)
    span = list(range(now - minutes + 1, now + 1))
    pipe = app.connections.broker.redis.pipeline(transaction=False)
    for minute in span:
        pipe.hgetall(app.connections.broker.throughput_key(minute))
    series: dict[str, dict[str, list[int]]] = {}
    for i, raw in enumerate(pipe.execute()):
        for field, value in raw.items():
            name, _, outcome = field.decode().rpartition(":")
            per = series.setdefault(name, {"succeeded": [0] * minutes, "failed": [0] * minutes})
            if outcome in per:
                per[outcome][i] = int(value)
    return ThroughputOut(minutes=span, series=series)


@get(
    "/healthz",
    opt=PUBLIC,
    summary="Liveness: Postgres and Redis answer",
    operation_id="healthz",
    responses=ERROR_RESPONSES(503, health=True),
)
@threaded
def healthz(state: State) -> Response[Health]:
    # Public, so anyone can flood it: the answer is reused for `probe_cache_s`, one round
    # trip to each backend per interval instead of one per request.
    probe: Reused[Health] | None = state.get("healthz")
    if probe is None:
        app = hj(state)
        probe = Reused(app.settings.probe_cache_s, lambda: _health(app))
        state["healthz"] = probe  # two first requests may each make one: harmless
    body = probe.get()
    return Response(body, status_code=200 if body.status == "ok" else 503)


def _health(app: App) -> Health:
    pg = rd = True
    try:
        app.connections.store.now()
    except Exception:  # any failure means "not healthy", reported, not raised
        pg = False
    try:
        app.connections.broker.redis.ping()
    except (redis.RedisError, OSError):
        rd = False
    return Health(status="ok" if pg and rd else "degraded", postgres=pg, redis=rd)


@get(
    "/metrics",
    responses=ERROR_RESPONSES(),
    operation_id="metrics",
    summary="Prometheus metrics of the whole fleet",
    media_type=CONTENT_TYPE,
)
@threaded
def metrics(state: State) -> LitestarResponse[str]:
    app = hj(state)
    return LitestarResponse(
        render(app.connections.store, app.connections.broker), media_type=CONTENT_TYPE
    )


HANDLERS: list[Any] = [job_types, workers, throughput, healthz, metrics]
