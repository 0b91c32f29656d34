"""Rows the store hands back to the broker and the coordinator: ids to push, claims held, queue
pages, the coordinator's lease, what a rescue did.

Tuples by design (NamedTuple): each is read straight off a result row (psycopg class_row),
and a Push is what Broker.push_many takes, so a row goes to Redis without being copied.
"""

from __future__ import annotations

from datetime import datetime
from typing import NamedTuple

import msgspec


class Push(NamedTuple):
    """A queued job's id for the broker: its Redis list is (name, priority)."""

    id: str
    name: str
    priority: int


class Requeued(NamedTuple):
    """A job Store.finish left waiting, `state` 'queued' (push its id) or 'scheduled': a
    claim put back (retry, suspension), or the next job of a sequence key the batch ended."""

    id: str
    name: str
    priority: int
    state: str


class HeldClaim(NamedTuple):
    """A running job of one process, with the claim token that fences its writes."""

    id: str
    claim_token: int


class JobRef(NamedTuple):
    """A live job's id and type (foreign ids in a pool's list, a shutdown's running jobs)."""

    id: str
    name: str


class QueuedEntry(NamedTuple):
    """One row of a queue's keyset page: the last one's (queued_at, id) starts the next."""

    id: str
    name: str
    priority: int
    queued_at: datetime


class KeyedQueued(NamedTuple):
    """A fair type's queued row, its key (fair_by's value) and whether the grace is past."""

    id: str
    queued_at: datetime
    key: str
    past_grace: bool


class OldestQueued(NamedTuple):
    """A queue's oldest queued row: when, and whether that is longer ago than the grace."""

    name: str
    priority: int
    queued_at: datetime
    past_grace: bool


class Lease(NamedTuple):
    """The coordinator lease as held: every guarded write checks holder and term."""

    holder: str
    term: int


class LeaseInfo(msgspec.Struct, frozen=True, kw_only=True):
    """The lease row as /metrics shows it: `valid` is false once it expired."""

    holder: str | None
    term: int
    valid: bool


class Rescued(msgspec.Struct, frozen=True, kw_only=True):
    """What one rescue of dead processes' claims did."""

    requeued: list[Push]  # to push to Redis
    failed: int
    # Claims whose id was already archived: the archived record won, the live row is gone.
    archived_duplicates: list[str]
