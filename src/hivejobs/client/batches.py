"""Batches: a group of jobs whose end runs a callback job once (docs/howto/batches.md).

`app.batch(on_complete="report")` checks the options and stores the batch; `Batch.enqueue`
and `enqueue_many` check each job as `app.enqueue` does, then store it with its membership
(store/batches.py). What happens when the batch's last job ends is decided in Postgres,
never here: this module only validates, stores and pushes ids.

A batch is *open* (anyone may add) until sealed: by leaving `with app.batch(...) as b:`
or by `b.seal()`. Sealed, it takes jobs only from its own running jobs (`ctx.batch`), and
completes when its last job ends. Its callbacks never run before it is sealed.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterable
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING

import msgspec

from hivejobs.client.enqueue import Into, arun, enqueue_many_plan, enqueue_plan, run
from hivejobs.client.integrations import adriver_connection, driver_connection
from hivejobs.errors import (
    BatchInvalid,
    BatchNotFound,
    PayloadInvalid,
    PayloadTooLarge,
    UnknownJobType,
)
from hivejobs.jobtypes import JobTypeSpec, check_priority
from hivejobs.records.batches import BatchDone, BatchStatus
from hivejobs.serialization import encode_json
from hivejobs.store.batches import FAILURES_SHOWN, AsyncBatchStore, BatchStore

if TYPE_CHECKING:
    from hivejobs.client.core import Core


def batch_params(
    core: Core,
    on_complete: str | None,
    on_success: str | None,
    data: object,
    priority: int,
) -> dict[str, object]:
    """The batch row to store, every option checked first: bad input stores nothing."""
    check_priority(priority)
    raw = encode_json(data, lambda detail: BatchInvalid("data", detail))
    if len(raw) > core.settings.max_payload_bytes:
        raise BatchInvalid(
            "data", f"{len(raw)} bytes, over max_payload_bytes ({core.settings.max_payload_bytes})"
        )
    params: dict[str, object] = {"id": str(uuid.uuid4()), "priority": priority, "data": raw}
    for field, name, event in (
        ("on_complete", on_complete, "complete"),
        ("on_success", on_success, "success"),
    ):
        jt = _callback_type(core, field, name, event, data)
        params[field] = None if jt is None else jt.name
        params[f"{event}_attempts"] = None if jt is None else jt.attempts
        params[f"{event}_delivery"] = None if jt is None else jt.delivery
    return params


def _callback_type(
    core: Core, field: str, name: str | None, event: str, data: object
) -> JobTypeSpec | None:
    """The callback's job type, which must take a BatchDone payload (its handler typed with
    BatchDone, or untyped)."""
    if name is None:
        return None
    if not isinstance(name, str):
        raise BatchInvalid(field, f"must be a job type name, not {name!r:.80}")
    try:
        with core.connections.postgres_errors():
            jt = core.job_type(name)
    except UnknownJobType as exc:
        raise BatchInvalid(field, str(exc)) from None
    report = BatchDone(
        batch_id="",
        event="complete" if event == "complete" else "success",
        total=0,
        succeeded=0,
        failed=0,
        cancelled=0,
        expired=0,
        failed_ids=[],
        failed_ids_truncated=False,
        data=data,
    )
    try:
        jt.encode(msgspec.to_builtins(report))
    except (PayloadInvalid, PayloadTooLarge) as exc:
        raise BatchInvalid(
            field, f"job type {name!r} cannot take the batch report (BatchDone): {exc}"
        ) from None
    return jt


class Batch:
    """A handle on one stored batch. `adder`: the running member job that holds it
    (ctx.batch), which may add to the batch after it is sealed; `conn`: the caller's
    connection the batch was created on, which the seal at the end of a `with` uses."""

    def __init__(
        self, core: Core, batch_id: str, *, adder: str | None = None, conn: object | None = None
    ) -> None:
        self._core = core
        self.id = batch_id
        self.adder = adder
        self.conn = conn

    def __repr__(self) -> str:
        return f"Batch({self.id!r})"

    def __enter__(self) -> Batch:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # Sealed on an error too: the jobs already added run, and the callback reports them.
        # In a caller's failed transaction the seal would fail and hide the error: skip it.
        if exc is None or self.conn is None:
            self.seal(conn=self.conn)

    def enqueue(
        self,
        name: str,
        payload: object = None,
        *,
        id: str | None = None,
        priority: int | None = None,
        delay: float | None = None,
        run_at: datetime | None = None,
        expires_at: datetime | None = None,
        conn: object | None = None,
    ) -> str:
        """`app.enqueue`, the job a member of this batch (in `conn`'s transaction if given).
        A duplicate in a unique window, or an id that exists already, is not added."""
        into, side = Into(self.id, self.adder), self._core.side
        return run(
            enqueue_plan(side, into, name, payload, id, priority, delay, run_at, expires_at, conn)
        )

    def enqueue_many(
        self,
        name: str,
        payloads: Iterable[object],
        *,
        priority: int | None = None,
        delay: float | None = None,
        expires_at: datetime | None = None,
        conn: object | None = None,
    ) -> list[str]:
        """`app.enqueue_many` into this batch: every payload checked first, one COPY."""
        into, side = Into(self.id, self.adder), self._core.side
        return run(enqueue_many_plan(side, into, name, payloads, priority, delay, expires_at, conn))

    def seal(self, conn: object | None = None) -> None:
        """No more jobs but from the batch's own running jobs; completes it at once if its
        jobs have all ended. Idempotent."""
        raw = driver_connection(conn) if conn is not None else None
        with self._core.connections.postgres_errors():
            BatchStore(self._core.connections.store).seal(self.id, raw)

    def status(self) -> BatchStatus:
        return batch_status(self._core, self.id)


class AsyncBatch:
    """`Batch` for event loops: `async with await app.abatch(...) as b: await b.enqueue(...)`."""

    def __init__(self, core: Core, batch_id: str, *, conn: object | None = None) -> None:
        self._core = core
        self.id = batch_id
        self.conn = conn

    async def __aenter__(self) -> AsyncBatch:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None or self.conn is None:
            await self.seal(conn=self.conn)

    async def enqueue(
        self,
        name: str,
        payload: object = None,
        *,
        id: str | None = None,
        priority: int | None = None,
        delay: float | None = None,
        run_at: datetime | None = None,
        expires_at: datetime | None = None,
        conn: object | None = None,
    ) -> str:
        into, side = Into(self.id, None), self._core.aside
        return await arun(
            enqueue_plan(side, into, name, payload, id, priority, delay, run_at, expires_at, conn)
        )

    async def enqueue_many(
        self,
        name: str,
        payloads: Iterable[object],
        *,
        priority: int | None = None,
        delay: float | None = None,
        expires_at: datetime | None = None,
        conn: object | None = None,
    ) -> list[str]:
        into, side = Into(self.id, None), self._core.aside
        return await arun(
            enqueue_many_plan(side, into, name, payloads, priority, delay, expires_at, conn)
        )

    async def seal(self, conn: object | None = None) -> None:
        raw = await adriver_connection(conn) if conn is not None else None
        backends = await self._core.connections.async_backends()
        with self._core.connections.postgres_errors():
            await AsyncBatchStore(backends.store).seal(self.id, raw)


def create_batch(core: Core, params: dict[str, object], conn: object | None) -> Batch:
    raw = driver_connection(conn) if conn is not None else None
    with core.connections.postgres_errors():
        BatchStore(core.connections.store).create(params, raw)
    return Batch(core, str(params["id"]), conn=conn)


async def acreate_batch(core: Core, params: dict[str, object], conn: object | None) -> AsyncBatch:
    raw = await adriver_connection(conn) if conn is not None else None
    backends = await core.connections.async_backends()
    with core.connections.postgres_errors():
        await AsyncBatchStore(backends.store).create(params, raw)
    return AsyncBatch(core, str(params["id"]), conn=conn)


def batch_status(core: Core, batch_id: str, failures: int = FAILURES_SHOWN) -> BatchStatus:
    """The batch's counters, state and first `failures` failed members; BatchNotFound."""
    if not isinstance(batch_id, str) or not 1 <= len(batch_id) <= 255 or "\x00" in batch_id:
        raise BatchInvalid("id", f"must be a string of 1-255 characters, not {batch_id!r:.80}")
    if isinstance(failures, bool) or not isinstance(failures, int) or failures < 0:
        raise BatchInvalid("failures", f"must be a count of 0 or more, not {failures!r:.80}")
    with core.connections.postgres_errors():
        status = BatchStore(core.connections.read_store).status(batch_id, failures)
    if status is None:
        raise BatchNotFound(batch_id)
    return status


def job_batch(core: Core, job_id: str) -> Batch | None:
    """The batch a running job belongs to, as a handle that may add to it while it runs."""
    with core.connections.postgres_errors():
        batch_id = BatchStore(core.connections.store).batch_of_job(job_id)
    return None if batch_id is None else Batch(core, batch_id, adder=job_id)


class BatchCalls:
    """The App's batch calls (a part of the App's facade)."""

    _core: Core

    def batch(
        self,
        *,
        on_complete: str | None = None,
        on_success: str | None = None,
        data: object = None,
        priority: int = 0,
        conn: object | None = None,
    ) -> Batch:
        """Store a batch and return its handle: `with app.batch(on_complete="report") as b:
        b.enqueue(...)`. Once sealed (leaving the block, or `b.seal()`) and every job of it
        has ended, job `on_complete` runs once with a BatchDone payload (counts, failed ids,
        `data`); `on_success` too when every job succeeded. `conn`: in the caller's
        transaction, with the rules of `enqueue`. docs/howto/batches.md."""
        params = batch_params(self._core, on_complete, on_success, data, priority)
        return create_batch(self._core, params, conn)

    async def abatch(
        self,
        *,
        on_complete: str | None = None,
        on_success: str | None = None,
        data: object = None,
        priority: int = 0,
        conn: object | None = None,
    ) -> AsyncBatch:
        """`batch` for event loops: `async with await app.abatch(...) as b:`."""
        params = await asyncio.to_thread(
            batch_params, self._core, on_complete, on_success, data, priority
        )  # may read declared types
        return await acreate_batch(self._core, params, conn)

    def batch_status(self, batch_id: str, failures: int = 1000) -> BatchStatus:
        """A batch's state, counters and its first `failures` failed members (by id);
        BatchNotFound if unknown."""
        return batch_status(self._core, batch_id, failures)

    def job_batch(self, job_id: str) -> Batch | None:
        """The batch of a live job, as a handle its own run may add to (JobContext.batch)."""
        return job_batch(self._core, job_id)
