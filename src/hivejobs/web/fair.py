"""The HTTP API's view of a fair type's keys (`fair_by`, broker/fair.py): each key with live
jobs and its queued, running and scheduled counts, as `hivejobs jobs --type NAME --by-key`
prints them, and the same table on the dashboard's type page (fair_keys). Reads only; the
rules live behind App.fair_keys.

No `from __future__ import annotations`: see web/threads.py.
"""

from typing import Annotated, Any

import msgspec
from litestar import get
from litestar.datastructures import State
from litestar.params import Parameter

from hivejobs.client.app import App
from hivejobs.errors import HivejobsError
from hivejobs.store.fair import KeyCount
from hivejobs.store.sequence import KeyState
from hivejobs.web.api import Name, hj
from hivejobs.web.errors import ERROR_RESPONSES
from hivejobs.web.threads import threaded

DASHBOARD_KEYS = 20  # the busiest keys a type page shows


class TypeKeysOut(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A fair type's keys with live jobs, busiest (most queued) first, at most `limit`; for
    a sequenced type (`sequence_by`, web/sequence.py) its keys as `hivejobs keys` lists them,
    held first (absent for a type without sequence_by)."""

    name: str
    fair_by: str
    keys: list[KeyCount]
    sequence_by: str | None = None
    sequence: list[KeyState] = msgspec.field(default_factory=list)


@get(
    "/v1/jobtypes/{name:str}/keys",
    operation_id="job_type_keys",
    summary="A fair type's keys with their queued, running and scheduled jobs",
    description="For a type declared with `fair_by`: the field's values that have live jobs, "
    "most queued first. For a type declared with `sequence_by`, `sequence` lists its keys "
    "with live jobs or a hold, held first: queued, scheduled and running counts, `next_id` "
    "(the job whose turn it is) and for a key held by a job failed for good `held_by`, "
    "`held_error` and `held_at` (`key` is the field's JSON text). 422 for a type with "
    "neither.",
    responses=ERROR_RESPONSES(404, 422),
)
@threaded
def job_type_keys(
    state: State,
    name: Name,
    limit: Annotated[int, Parameter(ge=1, le=1000, description="keys to show")] = 100,
) -> TypeKeysOut:
    app = hj(state)
    jt = app.job_type(name)
    if jt.sequence is not None:  # a sequenced type, fair or not
        return TypeKeysOut(
            name=name,
            fair_by="" if jt.fair is None else jt.fair.field,
            keys=[] if jt.fair is None else app.fair_keys(name, limit),
            sequence_by=jt.sequence.field,
            sequence=app.keys(name, limit),
        )
    keys = app.fair_keys(name, limit)
    fair = jt.fair
    return TypeKeysOut(name=name, fair_by=fair.field if fair is not None else "", keys=keys)


def fair_keys(app: App, name: str) -> tuple[str | None, list[KeyCount]]:
    """The dashboard's type page: a fair type's field and its busiest keys with their live
    jobs (None and [] for a type without fair_by, or one this process cannot look up)."""
    try:
        fair = app.job_type(name).fair
    except HivejobsError:
        return None, []
    if fair is None:
        return None, []
    return fair.field, app.fair_keys(name, DASHBOARD_KEYS)


HANDLERS: list[Any] = [job_type_keys]
