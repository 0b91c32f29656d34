"""The HTTP API, /v1: enqueue, read, cancel, replay, status callbacks, bulk actions and
chains (the fleet views, /healthz and /metrics are in fleet.py). Handlers are thin: every rule
lives in App (the same calls the Python API makes), every error is a HivejobsError mapped in
web/errors.py.

Handlers are synchronous (the App's store is psycopg's sync pool) and run in a worker thread
(threads.py); nothing here touches SQL. No `from __future__ import annotations` (threads.py).
"""

import asyncio
from typing import Annotated, Any

import msgspec
from litestar import Request, Response, delete, get, post, put
from litestar.datastructures import State
from litestar.exceptions import NotAuthorizedException
from litestar.params import JSONBody, Parameter, QueryParameter

from hivejobs.chains import Chain
from hivejobs.chains.builder import ChainFile
from hivejobs.client.app import App
from hivejobs.errors import ChainAlreadyFinished, HivejobsError, JobAlreadyFinished, JobNotFound
from hivejobs.records.jobs import JobInfo
from hivejobs.store.dashboard import DashboardStore, ListName
from hivejobs.web.auth import SIGNATURE_HEADER, Tokens
from hivejobs.web.errors import ERROR_RESPONSES
from hivejobs.web.schemas import (
    BatchBody,
    BatchOut,
    BulkBody,
    BulkItem,
    BulkOut,
    CallbackBody,
    CancelOut,
    ChainCreated,
    ChainJobOut,
    ChainListItem,
    ChainOut,
    ChainPage,
    ChainStopOut,
    EnqueueBody,
    JobListItem,
    JobLogOut,
    JobOut,
    JobPage,
)
from hivejobs.web.threads import threaded

ADMIN = {"admin": True}
PUBLIC = {"public": True}
Name = Annotated[str, Parameter(description="job type", min_length=1, max_length=64)]
JobId = Annotated[str, Parameter(description="job id", min_length=1, max_length=255)]
Limit = Annotated[int, Parameter(ge=1, le=500, description="rows per page")]


def hj(state: State) -> App:
    app: App = state.hivejobs
    return app


def job_out(info: JobInfo) -> JobOut:
    return JobOut(**msgspec.structs.asdict(info))


def _job_of_type(app: App, name: str, job_id: str) -> JobInfo:
    """A job id under another type's path is not found there (no leaking across types)."""
    info = app.get_job(job_id)
    if info.name != name:
        raise JobNotFound(job_id)
    return info


# -- jobs ----------------------------------------------------------------------------------


@put(
    "/v1/jobs/{name:str}/{job_id:str}",
    operation_id="put_job",
    opt=ADMIN,
    status_code=200,
    summary="Enqueue with your id (idempotent)",
    description="201 when stored now; 200 with the existing job when the same id already "
    "holds the same type and payload; 409 when it holds another.",
    responses=ERROR_RESPONSES(201, 404, 409, 413, 422),
)
async def put_job(
    state: State, name: Name, job_id: JobId, data: JSONBody[EnqueueBody]
) -> Response[JobOut]:
    # Async with the work in a thread: a sync handler returning a Response on a path with
    # several methods came back unawaited from Litestar 2.x's thread wrapper.
    info, created = await asyncio.to_thread(_put_job, hj(state), name, job_id, data)
    return Response(job_out(info), status_code=201 if created else 200)


def _put_job(app: App, name: str, job_id: str, data: EnqueueBody) -> tuple[JobInfo, bool]:
    app.job_type(name)  # unknown type: 404 before anything else
    try:
        app.get_job(job_id)
        existed = True
    except JobNotFound:
        existed = False
    app.enqueue(
        name,
        data.data,
        id=job_id,
        priority=data.priority,
        delay=data.delay,
        run_at=data.run_at,
        expires_at=data.expires_at,
    )
    return app.get_job(job_id), not existed


@post(
    "/v1/jobs/{name:str}",
    operation_id="post_job",
    opt=ADMIN,
    status_code=201,
    summary="Enqueue with a new id",
    responses=ERROR_RESPONSES(404, 413, 422),
)
@threaded
def post_job(state: State, name: Name, data: JSONBody[EnqueueBody]) -> JobOut:
    app = hj(state)
    job_id = app.enqueue(
        name,
        data.data,
        priority=data.priority,
        delay=data.delay,
        run_at=data.run_at,
        expires_at=data.expires_at,
    )
    return job_out(app.get_job(job_id))


@post(
    "/v1/jobs/{name:str}/batch",
    operation_id="post_batch",
    opt=ADMIN,
    status_code=201,
    summary="Enqueue many jobs of one type (all or nothing)",
    responses=ERROR_RESPONSES(404, 413, 422),
)
@threaded
def post_batch(state: State, name: Name, data: JSONBody[BatchBody]) -> BatchOut:
    ids = hj(state).enqueue_many(
        name, data.data, priority=data.priority, delay=data.delay, expires_at=data.expires_at
    )
    return BatchOut(ids=ids)


@get(
    "/v1/jobs/{name:str}/{job_id:str}",
    operation_id="get_job",
    summary="One job, live or finished",
    responses=ERROR_RESPONSES(404),
)
@threaded
def get_job(state: State, name: Name, job_id: JobId) -> JobOut:
    return job_out(_job_of_type(hj(state), name, job_id))


@delete(
    "/v1/jobs/{name:str}/{job_id:str}",
    operation_id="cancel_job",
    opt=ADMIN,
    status_code=200,
    summary="Cancel a job",
    description="A waiting job (or one awaiting its callback) ends cancelled at once; a "
    "running one is told to stop. 409 when it already finished otherwise.",
    responses=ERROR_RESPONSES(404, 409),
)
@threaded
def cancel_job(state: State, name: Name, job_id: JobId) -> CancelOut:
    app = hj(state)
    before = _job_of_type(app, name, job_id)
    if before.state == "cancelled":
        return CancelOut(id=job_id, outcome="already_cancelled")
    if not app.cancel(job_id):
        raise JobAlreadyFinished(job_id, app.get_job(job_id).state)
    after = app.get_job(job_id)
    return CancelOut(
        id=job_id, outcome="cancelled" if after.state == "cancelled" else "cancel_requested"
    )


@post(
    "/v1/jobs/{name:str}/{job_id:str}/replay",
    operation_id="replay_job",
    opt=ADMIN,
    status_code=201,
    summary="Enqueue a finished job again (a new job with a new id)",
    responses=ERROR_RESPONSES(404, 409),
)
@threaded
def replay_job(state: State, name: Name, job_id: JobId) -> JobOut:
    app = hj(state)
    _job_of_type(app, name, job_id)
    return job_out(app.get_job(app.replay(job_id)))


@post(
    "/v1/jobs/{name:str}/{job_id:str}",
    operation_id="post_callback",
    opt={**ADMIN, "callback": True},
    status_code=200,
    summary="Status callback (rickover)",
    description="The other service reports the outcome of attempt `attempt` of a job whose "
    "type was declared `callback=True`. A failed, retryable callback with attempts left is "
    "retried after the backoff. 409: wrong attempt, or the job is not running. An admin "
    "token or this type's callback token (HIVEJOBS_CALLBACK_TOKENS); when the type has a "
    "callback secret, `X-Hivejobs-Signature: sha256=<hex HMAC-SHA256 of the body>`.",
    responses=ERROR_RESPONSES(404, 409, 422),
)
async def post_callback(
    request: Request[Any, Any, Any],
    state: State,
    name: Name,
    job_id: JobId,
    data: JSONBody[CallbackBody],
) -> JobOut:
    tokens: Tokens = state.tokens
    if not tokens.signature_ok(name, await request.body(), request.headers.get(SIGNATURE_HEADER)):
        raise NotAuthorizedException(
            f"{SIGNATURE_HEADER} must be sha256=<hex HMAC-SHA256 of the body> keyed with the "
            f"callback secret of job type {name!r}"
        )
    return await asyncio.to_thread(_post_callback, hj(state), name, job_id, data)


def _post_callback(app: App, name: str, job_id: str, data: CallbackBody) -> JobOut:
    app.complete_callback(
        name,
        job_id,
        status=data.status,
        attempt=data.attempt,
        retryable=data.retryable,
        error=data.error,
    )
    return job_out(app.get_job(job_id))


@get(
    "/v1/jobs",
    operation_id="list_jobs",
    summary="A page of jobs in one state (keyset: pass `next` as `after`)",
    responses=ERROR_RESPONSES(422),
)
@threaded
def list_jobs(
    state: State,
    list_state: Annotated[ListName, QueryParameter(name="state")] = "failed",
    job_type: Annotated[str | None, QueryParameter(name="type", max_length=64)] = None,
    after: Annotated[str | None, Parameter(max_length=600)] = None,
    limit: Limit = 50,
) -> JobPage:
    rows, nxt = DashboardStore(hj(state).connections.store).jobs(list_state, job_type, after, limit)
    items = [msgspec.convert(r, JobListItem, from_attributes=True) for r in rows]
    return JobPage(jobs=items, next=nxt)


@post(
    "/v1/bulk",
    operation_id="bulk",
    opt=ADMIN,
    status_code=200,
    summary="Replay or cancel many jobs; one result per id",
    responses=ERROR_RESPONSES(422),
)
@threaded
def bulk(state: State, data: JSONBody[BulkBody]) -> BulkOut:
    app = hj(state)
    results: list[BulkItem] = []
    for job_id in data.ids:
        try:
            if data.action == "replay":
                results.append(BulkItem(id=job_id, ok=True, new_id=app.replay(job_id)))
            else:
                results.append(BulkItem(id=job_id, ok=app.cancel(job_id)))
        except HivejobsError as exc:
            results.append(BulkItem(id=job_id, ok=False, error=str(exc)))
    return BulkOut(results=results)


# -- chains --------------------------------------------------------------------------------


@post(
    "/v1/chains",
    operation_id="post_chain",
    opt=ADMIN,
    status_code=201,
    summary="Validate and start a chain (the JSON of `hivejobs chain run`)",
    responses=ERROR_RESPONSES(413, 422),
)
@threaded
def post_chain(state: State, data: JSONBody[ChainFile]) -> ChainCreated:
    chain = Chain.from_json(msgspec.json.encode(data))
    return ChainCreated(id=hj(state).run_chain(chain))


@get(
    "/v1/chains",
    summary="Chains, newest first (keyset pages)",
    operation_id="list_chains",
    responses=ERROR_RESPONSES(),
)
@threaded
def list_chains(
    state: State,
    after: Annotated[str | None, Parameter(max_length=600)] = None,
    limit: Limit = 50,
) -> ChainPage:
    rows, nxt = DashboardStore(hj(state).connections.store).chains(after, limit)
    items = [
        ChainListItem(**{f: getattr(r, f) for f in ChainListItem.__struct_fields__}) for r in rows
    ]
    return ChainPage(chains=items, next=nxt)


def chain_out(app: App, request_id: str) -> ChainOut:
    status = app.chain_status(request_id)
    data = msgspec.structs.asdict(status)
    data["jobs"] = [ChainJobOut(**msgspec.structs.asdict(j)) for j in status.jobs]
    data["log"] = [JobLogOut(**msgspec.structs.asdict(e)) for e in app.job_log(request_id)]
    return ChainOut(**data)


@get(
    "/v1/chains/{request_id:str}",
    operation_id="get_chain",
    summary="A chain, its jobs and its job log",
    responses=ERROR_RESPONSES(404),
)
@threaded
def get_chain(state: State, request_id: Annotated[str, Parameter(max_length=255)]) -> ChainOut:
    return chain_out(hj(state), request_id)


@post(
    "/v1/chains/{request_id:str}/stop",
    operation_id="stop_chain",
    opt=ADMIN,
    status_code=200,
    summary="Stop a live chain",
    responses=ERROR_RESPONSES(404, 409),
)
@threaded
def stop_chain(state: State, request_id: Annotated[str, Parameter(max_length=255)]) -> ChainStopOut:
    app = hj(state)
    if not app.stop_chain(request_id):
        raise ChainAlreadyFinished(request_id, app.chain_status(request_id).state)
    return ChainStopOut(id=request_id, stop_requested=True)


HANDLERS: list[Any] = [
    put_job,
    post_job,
    post_batch,
    bulk,
    list_jobs,
    get_job,
    cancel_job,
    replay_job,
    post_callback,
    post_chain,
    list_chains,
    get_chain,
    stop_chain,
]
