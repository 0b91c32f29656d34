"""The chain records every layer shares (spincycle's request, job chain and job log): a chain
and its jobs, a listing's row, a try's job-log row, the filters of a chain listing, a live
try as `chain ps` shows it, and the states of each.

As in records/jobs.py, a record the HTTP API also returns is defined once, as a generic
`...Fields` class over the types of its states: the record fills in the Literal, the API's
response class (web/schemas.py) plain `str`. Imports nothing of ours.
"""

from __future__ import annotations

from datetime import datetime
from typing import Generic, Literal, TypeVar

import msgspec

# The types that the records and the API's responses fill in differently (see the docstring).
StateT = TypeVar("StateT")
ChainJobT = TypeVar("ChainJobT")

ChainState = Literal["pending", "running", "succeeded", "failed", "stopped", "suspended"]
ChainJobState = Literal["pending", "running", "succeeded", "failed", "stopped"]
JobLogState = Literal["succeeded", "failed", "stopped"]  # how a try ended


class ChainJobFields(msgspec.Struct, Generic[StateT], frozen=True, kw_only=True):
    """One job of a chain: `try_` counts against `tries` in the current sequence try (a
    stopped try is not counted); `total_tries` counts every try ever started."""

    key: str
    type: str
    state: StateT
    after: list[str]
    sequence: str | None
    try_: int = msgspec.field(name="try")
    tries: int
    total_tries: int
    sequence_try: int | None
    job_id: str | None
    started_at: datetime | None
    finished_at: datetime | None
    status: str | None
    result: object
    error: str | None
    # While the chain job runs: its try's job now (queued, scheduled or running), the state
    # `chain ps` shows; None otherwise.
    job_state: str | None = None
    # The key of the chain job whose handler added this one (ctx.chain.add); None if declared.
    added_by: str | None = None


class ChainJobStatus(ChainJobFields[ChainJobState], frozen=True, kw_only=True):
    """One job of a chain (see ChainJobFields)."""


class ChainStatusFields(msgspec.Struct, Generic[StateT, ChainJobT], frozen=True, kw_only=True):
    """A chain and its jobs (ChainStatus; the API's ChainOut)."""

    id: str
    name: str
    state: StateT
    args: object
    stop_requested: bool
    suspensions: int
    created_at: datetime
    started_at: datetime | None
    suspended_at: datetime | None
    resumed_at: datetime | None
    finished_at: datetime | None
    jobs: list[ChainJobT]


class ChainStatus(ChainStatusFields[ChainState, ChainJobStatus], frozen=True, kw_only=True):
    """A chain and its jobs, as App.chain_status returns it."""


class ChainSummaryFields(msgspec.Struct, Generic[StateT], frozen=True, kw_only=True):
    """One chain of a listing (ChainSummary; the API's ChainListItem)."""

    id: str
    name: str
    state: StateT
    jobs: int
    succeeded: int
    created_at: datetime
    finished_at: datetime | None


class ChainSummary(ChainSummaryFields[ChainState], frozen=True, kw_only=True):
    """One chain, as App.list_chains returns it."""


class JobLogFields(msgspec.Struct, Generic[StateT], frozen=True, kw_only=True):
    """One try of one chain job: `try_` is the job's total try number at that try. `error`
    holds the traceback of a raised exception; `stdout`/`stderr` the tail of what the try
    printed (bounded by `job_log_output_bytes`; `output_truncated` when cut)."""

    key: str
    try_: int = msgspec.field(name="try")
    type: str
    job_id: str
    sequence_try: int | None
    state: StateT
    started_at: datetime | None
    finished_at: datetime
    duration_s: float | None
    error: str | None
    stdout: str | None = None
    stderr: str | None = None
    output_truncated: bool = False


class JobLogEntry(JobLogFields[JobLogState], frozen=True, kw_only=True):
    """One try of one chain job (see JobLogFields), as App.job_log returns it."""


class ChainQuery(msgspec.Struct, frozen=True, kw_only=True):
    """Filters of `list_chains`; every one optional. `type` is the chain's name (spincycle's
    request type); `job_type` keeps chains with a job of that type. Times bound created_at.
    Pages go newest first; `before` is the (created_at, id) of the last chain seen."""

    states: list[ChainState] | None = None
    type: str | None = None
    job_type: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    before: tuple[datetime, str] | None = None
    limit: int = 50


class RunningTry(msgspec.Struct, frozen=True, kw_only=True):
    """A live try of a chain job, as `hivejobs chain ps` shows it: `state` is its job's
    (queued or running; None once ended, until the traverser reaps it)."""

    chain_id: str
    chain: str
    key: str
    type: str
    try_: int = msgspec.field(name="try")
    tries: int
    total_tries: int
    state: str | None
    host: str | None
    pid: int | None
    status: str | None
    started_at: datetime | None
    age_s: float | None
