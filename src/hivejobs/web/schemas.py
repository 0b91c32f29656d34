"""Request and response bodies of the HTTP API: msgspec Structs, from which Litestar builds
the OpenAPI schema and with which it decodes bodies (a type error is a 422 naming the field).

A response that is a record (records/) field for field inherits it; where the record's
states are a Literal, it inherits the record's generic `...Fields` over `str` instead (the
API's schema has no enums for states). The others only look alike (fewer fields, or fields of
two records).

Litestar (2.25) does not put a generic base's type arguments into the schema of a subclass
(such a field comes out as an untyped object), so each subclass declares its type-variable
fields again with the same types; msgspec keeps them in the base's order.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

import msgspec

from hivejobs.flow import MAX_SCALE
from hivejobs.jobtypes import MAX_DELAY_S
from hivejobs.records.chains import (
    ChainJobFields,
    ChainStatusFields,
    ChainSummaryFields,
    JobLogFields,
)
from hivejobs.records.dispatch import LeaseInfo
from hivejobs.records.fleet import TypeFlow, WorkerInfo
from hivejobs.records.jobs import JobFields, JobSummaryFields

Priority = Annotated[int, msgspec.Meta(ge=0, le=9, description="0 runs first")]
Delay = Annotated[float, msgspec.Meta(ge=0, le=MAX_DELAY_S, description="seconds from now")]
MAX_BATCH = 10_000


class EnqueueBody(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """One job: `data` is its payload (validated against the job type's schema)."""

    data: Any = None
    priority: Priority | None = None
    delay: Delay | None = None
    run_at: datetime | None = None
    expires_at: datetime | None = None


class BatchBody(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Many jobs of one type with the same options: one payload per element of `data`."""

    data: Annotated[list[Any], msgspec.Meta(min_length=1, max_length=MAX_BATCH)]
    priority: Priority | None = None
    delay: Delay | None = None
    expires_at: datetime | None = None


class CallbackBody(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """rickover's status callback: the outcome of attempt `attempt`, from the other service."""

    status: Literal["succeeded", "failed"]
    attempt: Annotated[int, msgspec.Meta(ge=1, le=2**31 - 1)]
    retryable: bool = False
    error: Annotated[str, msgspec.Meta(max_length=65536)] | None = None


class BulkBody(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    action: Literal["replay", "cancel"]
    ids: Annotated[
        list[Annotated[str, msgspec.Meta(min_length=1, max_length=255)]],
        msgspec.Meta(min_length=1, max_length=500),
    ]


class JobOut(JobFields[str, str], frozen=True, kw_only=True):
    """records.JobInfo, its state and delivery as plain strings."""

    state: str
    delivery: str


class BatchOut(msgspec.Struct, kw_only=True):
    ids: list[str]


class CancelOut(msgspec.Struct, kw_only=True):
    id: str
    outcome: Literal["cancelled", "cancel_requested", "already_cancelled"]


class BulkItem(msgspec.Struct, kw_only=True, omit_defaults=True):
    id: str
    ok: bool
    new_id: str | None = None
    error: str | None = None


class BulkOut(msgspec.Struct, kw_only=True):
    results: list[BulkItem]


class JobListItem(JobSummaryFields[str], frozen=True, kw_only=True):
    """records.JobSummary without its listing position and expiry, its state as a plain
    string; `error` is the head of the last error (up to 300 characters)."""

    state: str


class JobPage(msgspec.Struct, kw_only=True):
    jobs: list[JobListItem]
    next: str | None  # the `after` of the next page; null on the last page


class JobTypeOut(msgspec.Struct, kw_only=True):
    name: str
    concurrency: int
    processes: int
    attempts: int
    delivery: str
    timeout_s: float | None
    callback: bool
    callback_timeout_s: float | None
    queued: int
    scheduled: int
    running: int
    # Paused fleet-wide (`hivejobs pause`): running jobs finish, nothing starts.
    paused: bool = False
    paused_at: datetime | None = None


class ScaleBody(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """`hivejobs scale NAME N`: runner threads per pool process of the type, fleet-wide."""

    concurrency: Annotated[int, msgspec.Meta(ge=1, le=MAX_SCALE)]


class TypeFlowOut(TypeFlow, frozen=True, kw_only=True):
    """A type's flow state (records.TypeFlow): its pools run `scaled_concurrency` threads
    per process when set, else `concurrency` (the code's)."""


class FlowChangeOut(TypeFlow, frozen=True, kw_only=True):
    """The flow state after a pause or resume; `changed` is false when the type already was
    paused (resumed): the request then changed nothing."""

    changed: bool


class WorkerOut(WorkerInfo, frozen=True, kw_only=True):
    """A worker process as the store reads it (records.WorkerInfo), under the API's name."""


class LeaderOut(LeaseInfo, frozen=True, kw_only=True):
    expires_in_s: float


class WorkersOut(msgspec.Struct, kw_only=True):
    workers: list[WorkerOut]
    leader: LeaderOut | None


class ChainCreated(msgspec.Struct, kw_only=True):
    id: str


class ChainStopOut(msgspec.Struct, kw_only=True):
    id: str
    stop_requested: bool


class ChainJobOut(ChainJobFields[str], frozen=True, kw_only=True):
    """records.ChainJobStatus, its state as a plain string."""

    state: str


class JobLogOut(JobLogFields[str], frozen=True, kw_only=True):
    """records.JobLogEntry, its state as a plain string."""

    state: str


class ChainOut(ChainStatusFields[str, ChainJobOut], frozen=True, kw_only=True):
    """records.ChainStatus, its states as plain strings, with the chain's job log."""

    state: str
    jobs: list[ChainJobOut]
    log: list[JobLogOut]


class ChainListItem(ChainSummaryFields[str], frozen=True, kw_only=True):
    """records.ChainSummary, its state as a plain string."""

    state: str


class ChainPage(msgspec.Struct, kw_only=True):
    chains: list[ChainListItem]
    next: str | None


class Health(msgspec.Struct, kw_only=True):
    status: Literal["ok", "degraded"]
    postgres: bool
    redis: bool


class ErrorOut(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Every error: `error` names the problem and what to do; `details` lists field errors."""

    error: str
    status: int
    details: list[dict[str, Any]] | None = None


class ThroughputOut(msgspec.Struct, kw_only=True):
    minutes: list[int]  # epoch minutes, oldest first
    series: dict[str, dict[str, list[int]]]  # type -> outcome -> count per minute
