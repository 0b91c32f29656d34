"""The HTTP API's flow control of job types: pause, resume and scale a type
fleet-wide, and read its flow state back. The handlers make the calls `hivejobs pause`,
`resume` and `scale` make (App.pause, App.resume, App.scale): the checks, the rules and the
SQL live behind them, once. Writes need an admin token, as every other write.

No `from __future__ import annotations`: see web/threads.py.
"""

from typing import Any

import msgspec
from litestar import delete, get, post, put
from litestar.datastructures import State
from litestar.params import JSONBody

from hivejobs.client.app import App
from hivejobs.web.api import ADMIN, Name, hj
from hivejobs.web.errors import ERROR_RESPONSES
from hivejobs.web.schemas import FlowChangeOut, ScaleBody, TypeFlowOut
from hivejobs.web.threads import threaded

PATH = "/v1/jobtypes/{name:str}"


def flow_out(app: App, name: str) -> TypeFlowOut:
    return TypeFlowOut(**msgspec.structs.asdict(app.flow(name)))


def change_out(app: App, name: str, changed: bool) -> FlowChangeOut:
    return FlowChangeOut(changed=changed, **msgspec.structs.asdict(app.flow(name)))


@get(
    PATH + "/flow",
    operation_id="job_type_flow",
    summary="A job type's pause and concurrency",
    description="`scaled_concurrency` is what `hivejobs scale` set (null: the pools run the "
    "code's `concurrency`).",
    responses=ERROR_RESPONSES(404),
)
@threaded
def job_type_flow(state: State, name: Name) -> TypeFlowOut:
    return flow_out(hj(state), name)


@post(
    PATH + "/pause",
    operation_id="pause_job_type",
    opt=ADMIN,
    status_code=200,
    summary="Pause a job type fleet-wide (`hivejobs pause`)",
    description="Running jobs finish; nothing new starts; queued and newly enqueued jobs "
    "wait, through restarts and Redis flushes. Idempotent: `changed` is false when the type "
    "was already paused.",
    responses=ERROR_RESPONSES(404),
)
@threaded
def pause_job_type(state: State, name: Name) -> FlowChangeOut:
    app = hj(state)
    return change_out(app, name, app.pause(name))


@post(
    PATH + "/resume",
    operation_id="resume_job_type",
    opt=ADMIN,
    status_code=200,
    summary="Resume a paused job type (`hivejobs resume`)",
    description="Pools start its jobs again within a second. Idempotent: `changed` is false "
    "when the type was not paused.",
    responses=ERROR_RESPONSES(404),
)
@threaded
def resume_job_type(state: State, name: Name) -> FlowChangeOut:
    app = hj(state)
    return change_out(app, name, app.resume(name))


@put(
    PATH + "/concurrency",
    operation_id="scale_job_type",
    opt=ADMIN,
    status_code=200,
    summary="Set a job type's concurrency fleet-wide, no restart (`hivejobs scale NAME N`)",
    description="Runner threads per pool process, from 1 to 1000; every pool of the type "
    "follows within a second. A scale-down interrupts no running job: pools claim less.",
    responses=ERROR_RESPONSES(404, 422),
)
@threaded
def scale_job_type(state: State, name: Name, data: JSONBody[ScaleBody]) -> TypeFlowOut:
    app = hj(state)
    app.scale(name, data.concurrency)
    return flow_out(app, name)


@delete(
    PATH + "/concurrency",
    operation_id="unscale_job_type",
    opt=ADMIN,
    status_code=200,
    summary="Back to the code's concurrency (`hivejobs scale NAME default`)",
    responses=ERROR_RESPONSES(404),
)
@threaded
def unscale_job_type(state: State, name: Name) -> TypeFlowOut:
    app = hj(state)
    app.scale(name, None)
    return flow_out(app, name)


HANDLERS: list[Any] = [
    job_type_flow,
    pause_job_type,
    resume_job_type,
    scale_job_type,
    unscale_job_type,
]
