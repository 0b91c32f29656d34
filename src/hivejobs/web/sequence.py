"""The HTTP API's view of sequences per key (`sequence_by`): a type's keys with their live
jobs, the job whose turn it is, and a held key's failed job and error; and the release of a
held key. The handlers make the calls `hivejobs keys` makes (App.keys, App.release_key).
Per key here, never in /metrics: the keys are unbounded, the metrics stay per type.

No `from __future__ import annotations`: see web/threads.py.
"""

from typing import Any

import msgspec
from litestar import get, post
from litestar.datastructures import State

from hivejobs.store.sequence import KeyState
from hivejobs.web.api import ADMIN, Name, hj
from hivejobs.web.errors import ERROR_RESPONSES
from hivejobs.web.threads import threaded

PATH = "/v1/jobtypes/{name:str}/keys"


class ReleaseBody(msgspec.Struct, frozen=True, kw_only=True):
    key: str  # the sequence_by field's JSON text, as /keys lists it ('"acme"', '42')


class ReleaseOut(msgspec.Struct, frozen=True, kw_only=True):
    released: bool
    held_by: str | None  # the failed job that held the key (it stays failed)


@get(
    PATH,
    operation_id="job_type_keys",
    summary="A sequenced job type's keys (`hivejobs keys NAME`)",
    description="Keys with live jobs or a hold, held keys first: queued, scheduled and "
    "running counts, `next_id` (the job whose turn it is) and, for a key held by a job "
    "failed for good (on_failure=hold), `held_by`, `held_error` and `held_at`. `key` is the "
    "field's JSON text. At most `limit` keys (default 1000).",
    responses=ERROR_RESPONSES(404, 422),
)
@threaded
def job_type_keys(state: State, name: Name, limit: int = 1000) -> list[KeyState]:
    return hj(state).keys(name, limit)


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
def release_job_type_key(state: State, name: Name, data: ReleaseBody) -> ReleaseOut:
    held_by = hj(state).release_key(name, data.key)
    return ReleaseOut(released=held_by is not None, held_by=held_by)


HANDLERS: list[Any] = [job_type_keys, release_job_type_key]
