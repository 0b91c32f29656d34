"""Debounce and coalesce keys (debounce.sql): the enqueue of a job into its key's window.

The decision is made in Postgres, under the key row's lock (`lock_debounce_key`): racing
enqueuers of one key, in any thread or process, go one after another, and each one's later
statements read a snapshot taken after the previous holder committed. So a key never has two
waiting jobs, and no merge is lost. Written as a plan (store/enqueue.py) that the sync and
async stores, on their own connection or in a caller's transaction, run alike. Never decides
what a merge is: the job type's merge function comes in the claim.
"""

from __future__ import annotations

from datetime import datetime

from hivejobs.records.jobs import DebounceClaim, Inserted, NewJob
from hivejobs.store.sql import Steps, load_queries

DEBOUNCE = load_queries("debounce.sql")


def debounce_plan(job: NewJob, claim: DebounceClaim) -> Steps[Inserted | None]:
    """Go into the key's waiting job; None when `job` starts a new window instead, which the
    caller then inserts as any job (store/enqueue.py), scheduled `within` seconds ahead.

    Returns the id of the job that will run, its state and priority, and as `created`
    whether it must be dispatched now (it became queued here: max_wait reached)."""
    row = yield DEBOUNCE["lock_debounce_key"], {"key": claim.key, "id": job.id}
    assert row is not None  # an upsert with RETURNING returns its row
    owner, first_at = str(row[0]), row[1]
    if owner == job.id:
        return None  # the key's first enqueue: its row now names this job
    joined = yield from _join(job, claim, owner, first_at)
    if joined is None:
        yield DEBOUNCE["start_debounce_window"], {"key": claim.key, "id": job.id}
    return joined


def _join(
    job: NewJob, claim: DebounceClaim, owner: str, first_at: datetime
) -> Steps[Inserted | None]:
    """This enqueue into the key's job if it has not started; None if it has (or is gone)."""
    if claim.mode == "debounce":
        params = {
            "owner": owner,
            "payload": job.payload,
            "priority": job.priority,
            "expires_at": job.expires_at,
            "within_s": claim.within_s,
            "first_at": first_at,
            "max_wait_s": claim.max_wait_s,
        }
        row = yield DEBOUNCE["debounce_into_waiting"], params
    else:
        assert claim.merge is not None  # a coalesce type declares one (debounce.checked)
        stored = yield DEBOUNCE["lock_waiting_for_merge"], {"owner": owner}
        if stored is None:
            return None
        # May raise (the type's merge, or its result failing the payload type): the caller's
        # savepoint or transaction is rolled back, and nothing of this enqueue is stored.
        merged = claim.merge(bytes(stored[0]), job.payload)
        params = {
            "owner": owner,
            "payload": merged,
            "priority": job.priority,
            "expires_at": job.expires_at,
        }
        row = yield DEBOUNCE["write_merge"], params
    if row is None:
        return None
    return Inserted(str(row[0]), str(row[1]), str(row[2]), int(row[3]), b"", bool(row[4]))
