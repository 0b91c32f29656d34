"""What a job is, as read from or written to Postgres: its states, the job to insert, the claim
a pool runs and the completion it writes, a job as `get_job` and listings return it.

A record the HTTP API also returns is defined once, as a generic `...Fields` class over the
types of its states: the record fills in the Literal, the API's response class (web/schemas.py)
plain `str`, so that its OpenAPI schema has no enums for states. Imports nothing of ours.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Generic, Literal, TypeVar, get_args

import msgspec

JobState = Literal["scheduled", "queued", "running", "succeeded", "failed", "cancelled", "expired"]
# The states of a finished job: the archive holds these alone.
TerminalState = Literal["succeeded", "failed", "cancelled", "expired"]
TERMINAL_STATES: frozenset[str] = frozenset(get_args(TerminalState))
Delivery = Literal["at_least_once", "at_most_once"]
# How a claim ended, as the pool reports it to the completer.
# "await_callback": a callback type's handler returned; the job stays running, without a
# worker, until the other service posts its outcome (or the callback timeout passes).
Outcome = Literal["succeeded", "failed", "retry", "cancelled", "suspend", "await_callback"]

PRIORITIES = range(10)  # 0 runs first; the default.
# A job type's name; fullmatch, never `$` (which also matches before a trailing newline).
JOB_TYPE_NAME_RE = re.compile(r"[A-Za-z0-9_.\-]{1,64}")

# The types that the records and the API's responses fill in differently (see the docstring).
StateT = TypeVar("StateT")
DeliveryT = TypeVar("DeliveryT")


class JobTypeInfo(msgspec.Struct, frozen=True, kw_only=True):
    """A registered job type as the worker fleet declares it in Postgres."""

    name: str
    concurrency: int
    processes: int
    attempts: int
    delivery: Delivery
    timeout_s: float | None
    callback: bool = False  # stays running after its handler until a status callback
    callback_timeout_s: float | None = None
    fair_by: str | None = None  # fair dispatch across this payload field's values
    # sequence_by and on_failure (sequence.py): a client enqueuing by name numbers its jobs too.
    sequence_by: str | None = None
    on_failure: str | None = None


class NewJob(msgspec.Struct, frozen=True, kw_only=True):
    """A validated job ready to insert: the payload is already encoded JSON."""

    id: str
    name: str
    priority: int
    attempts: int
    delivery: Delivery
    payload: bytes
    delay_s: float | None
    run_at: datetime | None
    expires_at: datetime | None
    unique: UniqueClaim | None = None
    trace_context: str | None = None  # the enqueue span's W3C traceparent (tracing.py)
    debounce: DebounceClaim | None = None
    # sequence_by (sequence.py): the key (the field's JSON text) and on_failure="hold".
    seq_key: str | None = None
    seq_hold: bool = False


@dataclass(frozen=True)
class DebounceClaim:
    """A debounce or coalesce key to go into (hivejobs/debounce.py says what each mode does).

    A dataclass, not a Struct: it carries the type's merge function, never sent anywhere.
    `merge(stored, new)` returns the encoded payload the job keeps (coalesce only)."""

    key: str
    mode: Literal["debounce", "coalesce"]
    within_s: float
    max_wait_s: float | None
    merge: Callable[[bytes, bytes], bytes] | None = None


class UniqueClaim(msgspec.Struct, frozen=True, kw_only=True):
    """A unique window to take before inserting: one job per key while it lasts and the
    key's job is in one of `states`."""

    key: str
    window_s: float
    states: tuple[str, ...]


class Inserted(msgspec.Struct, frozen=True):
    """What an insert returned: id, state, and whether this call created it."""

    id: str
    name: str
    state: str
    priority: int
    payload: bytes
    created: bool


class ClaimedJob(msgspec.Struct, kw_only=True):
    id: str
    name: str
    attempt: int
    attempts: int
    delivery: Delivery
    payload: bytes
    claim_token: int
    priority: int
    lost: int = 0  # times a process died running it: > 0 runs it alone (quarantine)
    pickup_s: float = 0.0  # from its due time (run_at) to this claim: the pickup latency
    trace_context: str | None = None  # the enqueue span's W3C traceparent (tracing.py)


class Completion(msgspec.Struct, frozen=True, kw_only=True):
    """One finished claim, written by the completer in a group-commit batch."""

    id: str
    claim_token: int
    outcome: Outcome
    error: str | None = None
    result: bytes | None = None
    retry_delay_s: float = 0.0
    callback_timeout_s: float = 0.0  # await_callback: how long the other service has


class JobFields(msgspec.Struct, Generic[StateT, DeliveryT], frozen=True, kw_only=True):
    """A job with its payload and result (JobInfo; the API's JobOut)."""

    id: str
    name: str
    state: StateT
    attempt: int
    attempts: int
    priority: int
    delivery: DeliveryT
    payload: object
    created_at: datetime
    run_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    expires_at: datetime | None
    error: str | None
    result: object


class JobInfo(JobFields[JobState, Delivery], frozen=True, kw_only=True):
    """A job, live or archived, as App.get_job returns it."""


class JobSummaryFields(msgspec.Struct, Generic[StateT], frozen=True, kw_only=True):
    """One job of a listing, live or archived, without payload or result (JobSummary; the
    API's JobListItem). `error_line`: the exception line of the error (`ValueError: ...`,
    display.exception_line), None when the job has no error."""

    id: str
    name: str
    state: StateT
    attempt: int
    attempts: int
    priority: int
    created_at: datetime
    run_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    error: str | None
    error_line: str | None


class JobSummary(JobSummaryFields[JobState], frozen=True, kw_only=True):
    """One job of a listing (see JobSummaryFields), as `list_jobs` and the dashboard's lists
    return it. `at` is its place in the listing's order (keyset): finished_at for a finished
    job; for a live one created_at in `list_jobs`, in the dashboard's lists the time its
    state orders by (queued_at, run_at, started_at). `error` is whole in `list_jobs`, its
    first 300 characters in the dashboard's lists."""

    expires_at: datetime | None
    at: datetime


class JobPage(msgspec.Struct, frozen=True, kw_only=True):
    """A page of `list_jobs`; pass `next` as `after` for the following page (None: the end)."""

    jobs: list[JobSummary]
    next: str | None


class Replayed(msgspec.Struct, frozen=True, kw_only=True):
    """What `replay` enqueued, and what it changed from the original's options."""

    id: str
    priority: int
    delay_s: float | None
    expires_at: datetime | None
    changes: list[str]
