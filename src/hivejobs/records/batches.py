"""A batch as stored and as its callback job receives it (client/batches.py, store/batches.py)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

import msgspec

BatchState = Literal["open", "sealed", "complete"]


class BatchDone(msgspec.Struct, frozen=True, kw_only=True):
    """The payload of a batch's callback job: annotate the callback handler's payload with
    it. `failed_ids` holds the first 1,000 ids (by id) of the jobs that did not succeed;
    `failed_ids_truncated` says there were more (`app.batch_status(id, failures=n)`)."""

    batch_id: str
    event: Literal["complete", "success"]
    total: int
    succeeded: int
    failed: int
    cancelled: int
    expired: int
    failed_ids: list[str]
    failed_ids_truncated: bool
    data: Any = None  # the batch's `data`: any JSON value (Any: `object` has no JSON Schema)


class BatchFailure(msgspec.Struct, frozen=True, kw_only=True):
    """A member of a batch that ended other than succeeded."""

    job_id: str
    name: str
    state: str


class BatchStatus(msgspec.Struct, frozen=True, kw_only=True):
    """A batch as stored: `open` takes jobs from anyone, `sealed` only from its own running
    jobs, `complete` none (its callbacks were enqueued, ids in *_job_id)."""

    id: str
    state: BatchState
    on_complete: str | None
    on_success: str | None
    priority: int
    total: int
    pending: int
    succeeded: int
    failed: int
    cancelled: int
    expired: int
    created_at: datetime
    sealed_at: datetime | None
    completed_at: datetime | None
    complete_job_id: str | None
    success_job_id: str | None
    data: Any = None  # the batch's `data`: any JSON value
    failures: list[BatchFailure] = msgspec.field(default_factory=list)
