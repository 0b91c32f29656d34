"""The HTTP API's release of a held key of a sequenced type (`sequence_by`), as
`hivejobs keys NAME --release KEY` (App.release_key). The keys themselves are listed by
GET /v1/jobtypes/{name}/keys (web/fair.py, shared with fair_by types). Per key here, never
in /metrics: the keys are unbounded, the metrics stay per type.

No `from __future__ import annotations`: see web/threads.py.
"""

from typing import Any

import msgspec
from litestar import post
from litestar.datastructures import State
from litestar.params import JSONBody

from hivejobs.web.api import ADMIN, Name, hj
from hivejobs.web.errors import ERROR_RESPONSES
from hivejobs.web.threads import threaded

PATH = "/v1/jobtypes/{name:str}/keys"


class ReleaseBody(msgspec.Struct, frozen=True, kw_only=True):
    key: str  # the sequence_by field's JSON text, as /keys lists it ('"acme"', '42')


class ReleaseOut(msgspec.Struct, frozen=True, kw_only=True):
    released: bool
    held_by: str | None  # the failed job that held the key (it stays failed)


@post(
    PATH + "/release",
    operation_id="release_job_type_key",
    opt=ADMIN,
    status_code=200,
    summary="Let a held key go on past its failed job (`hivejobs keys NAME --release KEY`)",
    description="The failed job stays failed; the key's next job starts. Replaying the "
    "failed job instead (POST /v1/jobs/.../replay) runs it first, then the key goes on.",
    responses=ERROR_RESPONSES(404, 422),
)
@threaded
def release_job_type_key(state: State, name: Name, data: JSONBody[ReleaseBody]) -> ReleaseOut:
    held_by = hj(state).release_key(name, data.key)
    return ReleaseOut(released=held_by is not None, held_by=held_by)


HANDLERS: list[Any] = [release_job_type_key]
