"""One chain job checked against the job-type registry: the row that stores it.

Shared by run_chain (client/chains.py) and ctx.chain.add (chains/growth.py), so that a job
added at run time passes exactly the checks a declared one does: known type, payload valid
for it (and its size limit), tries possible for its delivery, priority in range.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hivejobs.chains.validate import JobSpec
from hivejobs.errors import ChainInvalid, PayloadInvalid, PayloadTooLarge, UnknownJobType
from hivejobs.records.jobs import PRIORITIES

if TYPE_CHECKING:
    from hivejobs.jobtypes import JobTypeSpec

JobTypeLookup = Callable[[str], "JobTypeSpec"]


def job_row(spec: JobSpec, seq: str | None, job_type: JobTypeLookup) -> dict[str, Any]:
    """The stored row of one chain job, or ChainInvalid naming the job and what is wrong."""
    key = spec.key
    try:
        jt = job_type(spec.type)
        payload = jt.encode(spec.payload)  # limit_by checked too
        # A sequenced step keeps one place in its key's line for all the chain's tries of it
        # (docs/howto/sequences.md): a payload without the field stores nothing.
        seq_key = None if jt.sequence is None else jt.sequence.key(jt.name, payload)
    except (UnknownJobType, PayloadInvalid, PayloadTooLarge) as exc:
        raise ChainInvalid(f"job {key!r}: {exc}") from None
    if jt.delivery == "at_most_once" and spec.tries != 1:
        raise ChainInvalid(
            f"job {key!r}: job type {jt.name!r} is at_most_once, so it runs "
            f"at most one try: tries={spec.tries} is impossible"
        )
    priority = jt.priority if spec.priority is None else spec.priority
    if isinstance(priority, bool) or priority not in PRIORITIES:
        raise ChainInvalid(f"job {key!r}: priority must be an integer 0-9, not {priority!r}")
    return {
        "key": key,
        "name": jt.name,
        "payload": payload,
        "priority": priority,
        "delivery": jt.delivery,
        "after": list(spec.after),
        "seq": seq,
        "tries": spec.tries,
        "retry_wait_s": spec.retry_wait_s,
        "seq_key": seq_key,
        "seq_hold": jt.sequence is not None and jt.sequence.on_failure == "hold",
    }
