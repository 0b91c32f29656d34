"""Every error hivejobs raises on purpose: one hierarchy, messages that say what to do.

Nothing here imports the rest of the package, so every layer can raise these.
"""

from __future__ import annotations

import difflib
from typing import ClassVar, Literal

# What went wrong, from the caller's side: the one categorisation of our errors, which each
# edge turns into its own code (the CLI's exit status, the HTTP API's status).
ErrorKind = Literal[
    "usage",  # a command line or setting that cannot work
    "invalid",  # input refused by its checks (payload, options, chain)
    "unknown_type",  # a job type nobody registered or declared
    "too_large",  # input over its size limit
    "id_conflict",  # a job id reused with another type or payload
    "not_found",  # no job, chain or batch of that id
    "state_conflict",  # the thing exists but its state forbids the act (already finished)
    "unavailable",  # Postgres or Redis does not answer
    "failed",  # anything else we raised on purpose
]

# The kinds that are the caller's input: refused before anything was stored.
BAD_INPUT: frozenset[ErrorKind] = frozenset(
    {"usage", "invalid", "unknown_type", "too_large", "id_conflict"}
)


class HivejobsError(Exception):
    """Base of every error hivejobs raises on purpose; `kind` says what went wrong."""

    kind: ClassVar[ErrorKind] = "failed"


class ConfigError(HivejobsError):
    """A setting is missing, malformed or contradicts another one."""

    kind: ClassVar[ErrorKind] = "usage"


class UsageError(HivejobsError):
    """A command line that cannot run: unknown option, bad MODULE:APP, unreadable file.
    The CLI prints it on one line and exits 2 (bad usage), as argparse would."""

    kind: ClassVar[ErrorKind] = "usage"


class ConnectionFailed(HivejobsError):
    """Postgres or Redis did not answer; the message names which and where (redacted)."""

    kind: ClassVar[ErrorKind] = "unavailable"

    def __init__(
        self,
        service: str,
        url: str,
        reason: str,
        advice: str = "check that it runs and that the URL is right",
    ) -> None:
        self.service = service
        # The driver's reason may end in its own punctuation ("Connection refused."): one
        # separator between it and the advice, not ".;".
        super().__init__(f"cannot reach {service} at {url}: {reason.rstrip(' .;')}; {advice}")


class SchemaMissing(HivejobsError):
    """The database has no hivejobs tables yet: `hivejobs migrate` creates them."""

    def __init__(self) -> None:
        super().__init__(
            "the hivejobs tables do not exist in this database: run `hivejobs migrate`"
        )


class SchemaOutdated(HivejobsError):
    """The database schema is older than this hivejobs: `hivejobs migrate` updates it."""

    def __init__(self, found: int, needed: int) -> None:
        super().__init__(
            f"schema is at version {found}, hivejobs needs {needed}: run `hivejobs migrate`"
        )


class UnknownJobType(HivejobsError):
    """No job type of that name is registered here or declared by a worker fleet; the
    message suggests the closest known name."""

    kind: ClassVar[ErrorKind] = "unknown_type"

    def __init__(self, name: str, known: list[str]) -> None:
        close = difflib.get_close_matches(name, known, n=1)
        hint = f": did you mean {close[0]!r}?" if close else ""
        if not known:
            # Nothing declared here yet: a worker registers its types when it starts.
            super().__init__(
                f"unknown job type {name!r}: no job type is registered in this database yet;"
                " start a worker once (`hivejobs run MODULE:APP` registers its types), or pass"
                " the app that declares it (--app MODULE:APP)"
            )
        else:
            listing = ", ".join(sorted(known))
            super().__init__(f"unknown job type {name!r}{hint} (known: {listing})")
        self.name = name


class InvalidJobType(HivejobsError):
    """A job type name or its options are unusable (bad characters, bad delivery/attempts)."""

    kind: ClassVar[ErrorKind] = "usage"


class PayloadInvalid(HivejobsError):
    """A payload that does not fit its job type's payload type (msgspec's message kept)."""

    kind: ClassVar[ErrorKind] = "invalid"

    def __init__(self, name: str, detail: str) -> None:
        super().__init__(f"payload for job type {name!r} is invalid: {detail}")
        self.detail = detail


class PayloadTooLarge(HivejobsError):
    """An encoded payload over `max_payload_bytes`: refused before anything is stored."""

    kind: ClassVar[ErrorKind] = "too_large"

    def __init__(self, name: str, size: int, limit: int) -> None:
        super().__init__(
            f"payload for job type {name!r} is {size} bytes, over the limit of {limit} bytes; "
            "store large data elsewhere and pass a reference"
        )


class ResultTooLarge(HivejobsError):
    """A handler returned more than max_result_bytes: the attempt fails instead (a truncated
    JSON document would not be JSON)."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(
            f"result of {size} bytes exceeds max_result_bytes ({limit}); store large data "
            "elsewhere and return a reference"
        )


class InvalidArgument(HivejobsError):
    """An enqueue option (id, priority, delay, run_at, expires_at) is out of range."""

    kind: ClassVar[ErrorKind] = "invalid"


class JobDuplicate(HivejobsError):
    """A unique job type refused a duplicate in its window (`on_duplicate="raise"`)."""

    def __init__(self, name: str, existing_id: str) -> None:
        super().__init__(
            f"a {name!r} job with the same unique key exists ({existing_id!r}) within the "
            "type's unique window"
        )
        self.existing_id = existing_id


class JobIdConflict(HivejobsError):
    """A job id reused with another job type or payload (the same ones: an idempotent retry)."""

    kind: ClassVar[ErrorKind] = "id_conflict"

    def __init__(self, job_id: str) -> None:
        super().__init__(
            f"job id {job_id!r} already exists with a different job type or payload; "
            "use a new id, or the same payload to get the existing job"
        )
        self.job_id = job_id


class JobNotFound(HivejobsError):
    """No live or archived job has that id (or it was pruned)."""

    kind: ClassVar[ErrorKind] = "not_found"

    def __init__(self, job_id: str) -> None:
        super().__init__(f"no job with id {job_id!r}")
        self.job_id = job_id


class JobNotFinished(HivejobsError):
    """Replay takes finished jobs only; this one is still live."""

    kind: ClassVar[ErrorKind] = "state_conflict"

    def __init__(self, job_id: str, state: str) -> None:
        super().__init__(f"job {job_id!r} is {state}: only a finished job can be replayed")


class WaitTimeout(HivejobsError, TimeoutError):
    """app.wait gave up: the job still runs; wait again, or cancel it."""

    def __init__(self, job_id: str, timeout_s: float, state: str) -> None:
        super().__init__(f"job {job_id!r} is still {state} after waiting {timeout_s:g} s")
        self.job_id = job_id
        self.state = state


class JobAlreadyFinished(HivejobsError):
    """An action on a live job (cancel) came after the job had finished."""

    kind: ClassVar[ErrorKind] = "state_conflict"

    def __init__(self, job_id: str, state: str) -> None:
        super().__init__(f"job {job_id!r} already ended {state}: there is nothing to cancel")
        self.job_id = job_id


class ChainAlreadyFinished(HivejobsError):
    """An action on a live chain came after the chain had finished."""

    kind: ClassVar[ErrorKind] = "state_conflict"

    def __init__(self, request_id: str, state: str) -> None:
        super().__init__(f"chain {request_id!r} already ended {state}: there is nothing to stop")


class CallbackRefused(HivejobsError):
    """A status callback that does not apply: the job type takes none, or the job is not
    running at the attempt the callback names (HTTP 409)."""

    kind: ClassVar[ErrorKind] = "state_conflict"


class Interrupted(Exception):
    """Raised by a handler that saw ``ctx.stopping``: the attempt is suspended, not failed.

    Not a HivejobsError: it is control flow, like Retry.
    """


class ChainInvalid(HivejobsError):
    """A chain that cannot run (cycle, unknown job type or dependency, bad sequence): refused
    before anything is stored. The message names the jobs at fault."""

    kind: ClassVar[ErrorKind] = "invalid"


class ChainNotFound(HivejobsError):
    """No chain has that request id."""

    kind: ClassVar[ErrorKind] = "not_found"

    def __init__(self, request_id: str) -> None:
        super().__init__(f"no chain with request id {request_id!r} (see `hivejobs chain list`)")
        self.request_id = request_id


class ChainStopPending(HivejobsError):
    """`stop_chain(wait=True)` outlived the stop timeout: no coordinator ended the chain."""

    def __init__(self, request_id: str, state: str) -> None:
        super().__init__(
            f"chain {request_id!r} is still {state} after its stop timeout: is a coordinator "
            "running (`hivejobs run`)? The stop stays requested and takes effect when one runs"
        )
        self.request_id = request_id


class NotAnAncestor(HivejobsError):
    """ctx.chain.result_of(key) for a job the current one does not run after: its result
    may not exist yet, so reading it would be a race."""

    def __init__(self, key: str, me: str, ancestors: list[str]) -> None:
        listing = ", ".join(sorted(ancestors)) or "none: it is a root job"
        super().__init__(
            f"job {key!r} is not an ancestor of {me!r}, so its result may not exist yet; "
            f"result_of() reads jobs that {me!r} runs after, directly or not ({listing})"
        )
        self.key = key


class DrainIncomplete(HivejobsError):
    """hivejobs.testing.drain ran its limit of attempts and jobs were still queued."""

    def __init__(self, max_jobs: int) -> None:
        super().__init__(
            f"drain ran {max_jobs} attempts and jobs are still queued: a job that enqueues "
            "itself forever? Raise max_jobs if this is expected"
        )


class PayloadUncheckable(InvalidArgument):
    """A job type known only from Postgres whose payload schema is unknown (no worker of
    this version declared it): the enqueue is refused rather than stored unchecked."""

    def __init__(self, name: str, why: str) -> None:
        super().__init__(
            f"cannot check the payload of job type {name!r}: {why}; enqueue with the app "
            "(--app MODULE:APP or HIVEJOBS_APP) so that its own type checks it"
        )


class BatchInvalid(InvalidArgument):
    """A batch option refused before anything is stored; `field` names it."""

    def __init__(self, field: str, detail: str) -> None:
        super().__init__(f"batch {field}: {detail}")
        self.field = field


class BatchNotFound(HivejobsError):
    """No batch has that id (or it was pruned)."""

    kind: ClassVar[ErrorKind] = "not_found"

    def __init__(self, batch_id: str) -> None:
        super().__init__(f"no batch with id {batch_id!r}")
        self.batch_id = batch_id


class BatchClosed(HivejobsError):
    """Jobs added to a batch that no longer takes them: sealed (only its own running jobs
    may add) or complete (its callbacks ran or are queued)."""

    kind: ClassVar[ErrorKind] = "state_conflict"

    def __init__(self, batch_id: str, state: str) -> None:
        why = (
            "its callbacks were already enqueued"
            if state == "complete"
            else "only its own running jobs may add to it now (ctx.batch)"
        )
        super().__init__(f"batch {batch_id!r} is {state}: {why}")
        self.batch_id = batch_id
        self.state = state
