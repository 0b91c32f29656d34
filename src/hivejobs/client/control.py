"""The App's control calls: cancel, status callbacks, flow control (pause, resume, scale),
fair and sequence keys, replay. Each checks its input, then one store call (store/) decides;
the logic of flow control is in flow.py, of sequences in sequence.py.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Literal

import redis
from loguru import logger

from hivejobs.broker.channels import ControlMessage
from hivejobs.client.enqueue import enqueue_plan, run
from hivejobs.errors import CallbackRefused, InvalidArgument, JobNotFinished, JobNotFound
from hivejobs.flow import pause_type, paused_types, resume_type, scale_type, type_settings
from hivejobs.jobtypes import check_id
from hivejobs.logs import error_fields
from hivejobs.metrics import record_callback
from hivejobs.records.fleet import TypeFlow
from hivejobs.records.jobs import Replayed
from hivejobs.serialization import storable_text
from hivejobs.store.fair import FairStore, KeyCount
from hivejobs.store.sequence import KeyState, SequenceStore

if TYPE_CHECKING:
    from hivejobs.client.core import Core, Mode
    from hivejobs.store.callbacks import CallbackResult


class Control:
    """The App's calls that act on stored jobs and types (a part of the App's facade)."""

    _core: Core
    _mode: Mode

    def cancel(self, job_id: str) -> bool:
        """Cancel a waiting job now, or tell a running one to stop (it ends `cancelled`
        unless it succeeds first). False when the job has already finished."""
        check_id(job_id)
        outcome = self._core.connections.store.cancel(job_id)
        if outcome is None:
            self._mode.get_job(job_id)  # raises JobNotFound for unknown ids
            return False
        if outcome == "requested":
            try:
                self._core.connections.broker.publish_control(
                    ControlMessage(action="cancel", job_id=job_id)
                )
            except redis.RedisError as exc:
                logger.warning(
                    "cancel stored but not broadcast; the job ends cancelled if it fails",
                    job_id=job_id,
                    **error_fields(exc),
                )
        return True

    def complete_callback(
        self,
        name: str,
        job_id: str,
        *,
        status: Literal["succeeded", "failed"],
        attempt: int,
        retryable: bool = False,
        error: str | None = None,
    ) -> CallbackResult:
        """The other service's outcome for attempt `attempt` of a callback job (rickover).

        A failed, retryable callback with attempts left is retried after the type's backoff;
        otherwise the job ends `status`. A wrong attempt or a job that is not running raises
        CallbackRefused (HTTP 409); an unknown job JobNotFound."""
        from hivejobs.store.callbacks import CallbackStore

        jt = self._core.job_type(name)
        if not jt.callback:
            raise CallbackRefused(f"job type {name!r} does not take status callbacks")
        if status not in ("succeeded", "failed"):
            raise InvalidArgument(f"status must be 'succeeded' or 'failed', not {status!r}")
        if error is not None and "\x00" in error:
            raise InvalidArgument("error must not contain NUL characters (\\u0000)")
        delay = jt.backoff.delay_s(attempt) if status == "failed" and retryable else None
        text = (
            error if error is not None else (None if status == "succeeded" else "callback: failed")
        )
        if text is not None:
            text = storable_text(text, self._core.settings.max_result_bytes)
        result = CallbackStore(self._core.connections.store).complete(
            name, job_id, attempt, status, delay, text
        )
        if result.outcome is None:
            if result.state is None:
                raise JobNotFound(job_id)
            raise CallbackRefused(
                f"job {job_id!r} is {result.state} at attempt {result.attempt}: a callback for "
                f"attempt {attempt} is refused (only a running job's current attempt takes one)"
            )
        record_callback(self._core.connections.broker, name, result.outcome)
        return result

    # -- flow control (the logic is in flow.py) -------------------------------------------

    def pause(self, name: str) -> bool:
        """Pause job type `name` across the fleet: running jobs finish, nothing new starts,
        queued jobs wait, through restarts and Redis flushes. False if it was paused."""
        self._core.job_type(name)  # UnknownJobType, with the names it knows
        return pause_type(self._core.connections.store, name)

    def resume(self, name: str) -> bool:
        """Let a paused type run again (within a second). False if it was not paused."""
        self._core.job_type(name)
        return resume_type(self._core.connections.store, name)

    def scale(self, name: str, concurrency: int | None) -> None:
        """Runner threads per pool process of `name`, across the fleet, without a restart
        (pools look within a second); None: back to the type's own `concurrency`. A
        scale-down interrupts no running job: pools just claim less."""
        self._core.job_type(name)
        scale_type(self._core.connections.store, name, concurrency)

    def paused(self) -> list[str]:
        """The paused job types."""
        return paused_types(self._core.connections.store)

    def flow(self, name: str) -> TypeFlow:
        """Job type `name`'s flow state: paused or not (since when), and the runner threads
        per pool process its pools use (`scale`'s, else the code's `concurrency`)."""
        concurrency = self._core.job_type(name).concurrency  # UnknownJobType first
        settings = type_settings(self._core.connections.store, name)
        return TypeFlow(
            name=name,
            paused=settings.paused,
            paused_at=settings.paused_at,
            concurrency=concurrency,
            scaled_concurrency=settings.concurrency,
        )

    def fair_keys(self, name: str, limit: int = 100) -> list[KeyCount]:
        """The keys of fair type `name` with live jobs (queued, running, scheduled), busiest
        first; InvalidArgument for a type without fair_by. Reads the type's live rows: for a
        person asking, not for a loop."""
        jt = self._core.job_type(name)  # UnknownJobType first
        if jt.fair is None:
            raise InvalidArgument(f"job type {name!r} has no fair_by: it has no keys to show")
        return FairStore(self._core.connections.read_store, name, jt.fair.field).key_counts(limit)

    def replay(self, job_id: str) -> str:
        """Enqueue a finished job again, as a new job with a new id; returns that id.
        Its options are kept as `replay_job` says (and logs)."""
        return self.replay_job(job_id).id

    def replay_job(self, job_id: str) -> Replayed:
        """Enqueue a finished job again with its original options, as rickover's replay:
        priority as is, its delay (run_at - created_at) again from now, and its expires_at,
        moved by as much as the replay comes later when it has passed. `changes` says what
        differs from the original, for the caller to show."""
        check_id(job_id)
        info = self._mode.get_job(job_id)
        if info.state not in ("succeeded", "failed", "cancelled", "expired"):
            raise JobNotFinished(job_id, info.state)
        from hivejobs.client.listing import replay_options

        plan = replay_options(info, datetime.now(UTC))
        new_id = run(
            enqueue_plan(
                self._mode.side,
                None,
                info.name,
                info.payload,
                None,
                plan.priority,
                plan.delay_s,
                None,
                plan.expires_at,
                None,
            )
        )
        logger.info("job replayed", job_id=job_id, new_id=new_id, changes=plan.changes)
        self._replay_in_sequence(info.name, job_id, new_id)
        return Replayed(
            id=new_id,
            priority=plan.priority,
            delay_s=plan.delay_s,
            expires_at=plan.expires_at,
            changes=plan.changes,
        )

    def _replay_in_sequence(self, name: str, job_id: str, new_id: str) -> None:
        """The replay of the job that holds its key takes that job's place: it runs first,
        then the key goes on. The key stays held until then: nothing of it starts between."""
        jt = self._core.types.get(name)
        if jt is None or jt.sequence is None:
            return
        new = self._core.connections.store.get_row(new_id)
        key = None if new is None else jt.sequence.key(name, bytes(new["payload"]))
        if (
            key is not None
            and SequenceStore(self._core.connections.store).hold_of(name, key) == job_id
        ):
            SequenceStore(self._core.connections.store).take_hold_place(name, key, job_id, new_id)
            logger.info("replay takes the held job's turn", job_id=job_id, new_id=new_id)

    def _sequenced(self, name: str) -> None:
        if self._core.job_type(name).sequence is None:  # UnknownJobType first
            raise InvalidArgument(f"job type {name!r} has no sequence_by: it has no keys")

    def keys(self, name: str, limit: int = 1000) -> list[KeyState]:
        """A sequenced type's keys with live jobs or a hold (held first): queued, scheduled
        and running counts, the job whose turn it is, and the hold with its error."""
        self._sequenced(name)
        return SequenceStore(self._core.connections.store).keys(name, limit)

    def release_key(self, name: str, key: str) -> str | None:
        """Let a held key go on past its failed job (which stays failed); returns that job's
        id, or None when the key was not held. `key` is the field's JSON text ('"acme"')."""
        self._sequenced(name)
        released = SequenceStore(self._core.connections.store).release(name, key)
        if released is not None:
            logger.info("sequence key released", job_type=name, held_by=released)
        return released
