"""Sequences per key: `@app.job(..., sequence_by="account_id", on_failure="hold")`.

At most one job of a key runs at a time, in enqueue order. Where each part is decided:

- order: at enqueue a job takes the next number of its key (hivejobs_sequence.last_seq,
  store/sequence.sql insert_job_in_sequence) under that row's lock, held to the enqueuer's
  commit, so a smaller number is always committed before a larger one is given;
- one at a time, in order: the claim (store/sequence.py claim_in_sequence) takes its keys'
  advisory locks, then claims a job only if no job of its key runs, none comes before it and
  the key is not held. Every claim of a key happens under that lock, so the guard is exact
  whatever Redis delivers (duplicates, reorders, a flush) and however many pools race;
- dispatch: a job refused because its key is busy is parked (queued_at NULL: not in Redis,
  not seen by the reconciler, not put back); when a sequenced job leaves the live table
  (archived in any state), a trigger (migrations 0017, 0023) takes the key's lock and
  unparks the key's next job, or records the hold. A pool's completion batch pushes the
  jobs its hand-overs unparked right after its commit (store/sequence.py handed_over); any
  other ending dispatches them with a NOTIFY. A lost push or NOTIFY, or a flushed Redis, is
  repaired by the reconciler, which sees the unparked job as any queued job;
- failures: a failed attempt with attempts left keeps the job live (queued or scheduled for
  its retry), so it stays the key's next job and the key waits for it. A job failed for good
  holds the key with on_failure="hold" (until `App.replay` of that job, which then runs
  first, or `App.release_key`), and lets the key go on with on_failure="continue";
- chain steps: a sequenced step takes one place in its key's line when its chain starts its
  first try (take_places in store/traversal.sql) and every try runs at that number; the
  place (hivejobs_sequence_place, migration 0024) stands in for the step between tries, so
  the claim and the hand-over wait for it as for a live job. A try's success gives it up in
  its completion; the traverser ends it when the step failed for good (holding the key as
  above) or its chain ended (coordinator/traverser.py, _end_places).

Never decides from Redis; never blocks a pool on an enqueuer's transaction (the claim's lock
is not the enqueue's row lock).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import msgspec

from hivejobs.errors import InvalidJobType, PayloadInvalid

OnFailure = Literal["hold", "continue"]
ON_FAILURE: tuple[OnFailure, ...] = ("hold", "continue")

_decoder = msgspec.json.Decoder()


@dataclass(frozen=True)
class SequenceBy:
    """A sequenced type's options: the payload field whose value is the key, and what a job
    failed for good does to its key."""

    field: str
    on_failure: OnFailure

    def key(self, name: str, payload: bytes) -> str:
        """The job's key: the field's value as JSON text (42 and "42" are two keys), or
        PayloadInvalid naming the field when the payload has none."""
        value = _decoder.decode(payload)
        if not isinstance(value, dict):
            raise PayloadInvalid(name, f"sequence_by={self.field!r} needs a JSON object payload")
        if self.field not in value:
            raise PayloadInvalid(
                name, f"the payload has no {self.field!r} field (sequence_by={self.field!r})"
            )
        return msgspec.json.encode(value[self.field]).decode()


def checked_sequence(
    sequence_by: object, on_failure: object, cron: str | None
) -> SequenceBy | None:
    """The sequence options of `@app.job(...)`, or a clear InvalidJobType; None without."""
    if sequence_by is None:
        if on_failure is not None:
            raise InvalidJobType(
                "on_failure needs sequence_by (it says what a failure does to its key)"
            )
        return None
    if not isinstance(sequence_by, str) or not sequence_by:
        raise InvalidJobType(
            f"sequence_by must be the name of a payload field, not {sequence_by!r}"
        )
    mode = "hold" if on_failure is None else on_failure
    if mode not in ON_FAILURE:
        raise InvalidJobType(f"on_failure must be 'hold' or 'continue', not {on_failure!r}")
    if cron is not None:
        raise InvalidJobType(
            "sequence_by cannot go with cron: a periodic job has no payload, so no key"
        )
    return SequenceBy(field=sequence_by, on_failure="hold" if mode == "hold" else "continue")


def declared_sequence(sequence_by: str | None, on_failure: str | None) -> SequenceBy | None:
    """The sequence a worker fleet declared for a type (hivejobs_job_type), for a client that
    enqueues by name: its jobs are numbered and checked as the worker's own App would."""
    if sequence_by is None:
        return None
    return SequenceBy(
        field=sequence_by, on_failure="continue" if on_failure == "continue" else "hold"
    )
