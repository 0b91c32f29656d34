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

import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Protocol

import msgspec

from hivejobs.client.integrations import adriver_connection, driver_connection
from hivejobs.errors import (
    BatchInvalid,
    BatchNotFound,
    PayloadInvalid,
    PayloadTooLarge,
    UnknownJobType,
)
from hivejobs.jobtypes import JobType, check_priority
from hivejobs.records import BatchDone, BatchStatus, Push
from hivejobs.serialization import encode_json
from hivejobs.store.batches import FAILURES_SHOWN, AsyncBatchStore, BatchStore
from hivejobs.store.enqueue import owns_transaction

if TYPE_CHECKING:
    from hivejobs.broker import Pusher
    from hivejobs.client.aio import AsyncBackends
    from hivejobs.client.connections import Connections
    from hivejobs.config import Settings
    from hivejobs.store import Store


class App(Protocol):
    """What batches use of the App (client/app.py), which imports this module."""

    settings: Settings
    connections: Connections

    @property
    def store(self) -> Store: ...
    @property
    def read_store(self) -> Store: ...
    @property
    def pusher(self) -> Pusher: ...
    def job_type(self, name: str) -> JobType: ...
    async def _ajob_type(self, name: str) -> JobType: ...
    async def async_backends(self) -> AsyncBackends: ...
    def _push(self, name: str, priority: int, ids: Sequence[str]) -> None: ...
    async def _apush(self, backends: AsyncBackends, pushes: Sequence[Push]) -> None: ...


def batch_params(
    app: App,
    on_complete: str | None,
    on_success: str | None,
    data: object,
    priority: int,
) -> dict[str, object]:
    """The batch row to store, every option checked first: bad input stores nothing."""
    check_priority(priority)
    raw = encode_json(data, lambda detail: BatchInvalid("data", detail))
    if len(raw) > app.settings.max_payload_bytes:
        raise BatchInvalid(
            "data", f"{len(raw)} bytes, over max_payload_bytes ({app.settings.max_payload_bytes})"
        )
    params: dict[str, object] = {"id": str(uuid.uuid4()), "priority": priority, "data": raw}
    for field, name, event in (
        ("on_complete", on_complete, "complete"),
        ("on_success", on_success, "success"),
    ):
        jt = _callback_type(app, field, name, event, data)
        params[field] = None if jt is None else jt.name
        params[f"{event}_attempts"] = None if jt is None else jt.attempts
        params[f"{event}_delivery"] = None if jt is None else jt.delivery
    return params


def _callback_type(
    app: App, field: str, name: str | None, event: str, data: object
) -> JobType | None:
    """The callback's job type, which must take a BatchDone payload (its handler typed with
    BatchDone, or untyped)."""
    if name is None:
        return None
    if not isinstance(name, str):
        raise BatchInvalid(field, f"must be a job type name, not {name!r:.80}")
    try:
        with app.connections.postgres_errors():
            jt = app.job_type(name)
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
        self, app: App, batch_id: str, *, adder: str | None = None, conn: object | None = None
    ) -> None:
        self.app = app
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
        app = self.app
        with app.connections.postgres_errors():
            jt = app.job_type(name)
        job = jt.new_job(payload, id, priority, delay, run_at, expires_at)
        raw = driver_connection(conn) if conn is not None else None
        own = raw is None or owns_transaction(raw)
        with app.connections.postgres_errors():
            inserted = BatchStore(app.store).add_one(self.id, self.adder, job, id is not None, raw)
        job_id, created = jt.outcome(job, inserted)
        if created and own:
            app.pusher.submit(job.name, job.priority, [job.id])
        return job_id

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
        app = self.app
        with app.connections.postgres_errors():
            jt = app.job_type(name)
        jobs = jt.new_jobs(payloads, priority, delay, expires_at)
        if not jobs:
            return []
        raw = driver_connection(conn) if conn is not None else None
        with app.connections.postgres_errors():
            pushes = BatchStore(app.store).add_many(self.id, self.adder, jobs, raw)
        if pushes:
            app._push(name, pushes[0][2], [p.id for p in pushes])
        return [j.id for j in jobs]

    def seal(self, conn: object | None = None) -> None:
        """No more jobs but from the batch's own running jobs; completes it at once if its
        jobs have all ended. Idempotent."""
        raw = driver_connection(conn) if conn is not None else None
        with self.app.connections.postgres_errors():
            BatchStore(self.app.store).seal(self.id, raw)

    def status(self) -> BatchStatus:
        return batch_status(self.app, self.id)


class AsyncBatch:
    """`Batch` for event loops: `async with await app.abatch(...) as b: await b.enqueue(...)`."""

    def __init__(self, app: App, batch_id: str, *, conn: object | None = None) -> None:
        self.app = app
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
        app = self.app
        jt = await app._ajob_type(name)
        job = jt.new_job(payload, id, priority, delay, run_at, expires_at)
        raw = await adriver_connection(conn) if conn is not None else None
        own = raw is None or owns_transaction(raw)
        backends = await app.async_backends()
        with app.connections.postgres_errors():
            store = AsyncBatchStore(backends.store)
            inserted = await store.add_one(self.id, None, job, id is not None, raw)
        job_id, created = jt.outcome(job, inserted)
        if created and own:
            await app._apush(backends, [Push(job.id, job.name, job.priority)])
        return job_id

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
        app = self.app
        jt = await app._ajob_type(name)
        jobs = jt.new_jobs(payloads, priority, delay, expires_at)
        if not jobs:
            return []
        raw = await adriver_connection(conn) if conn is not None else None
        backends = await app.async_backends()
        with app.connections.postgres_errors():
            pushes = await AsyncBatchStore(backends.store).add_many(self.id, None, jobs, raw)
        await app._apush(backends, pushes)
        return [j.id for j in jobs]

    async def seal(self, conn: object | None = None) -> None:
        raw = await adriver_connection(conn) if conn is not None else None
        backends = await self.app.async_backends()
        with self.app.connections.postgres_errors():
            await AsyncBatchStore(backends.store).seal(self.id, raw)


def create_batch(app: App, params: dict[str, object], conn: object | None) -> Batch:
    raw = driver_connection(conn) if conn is not None else None
    with app.connections.postgres_errors():
        BatchStore(app.store).create(params, raw)
    return Batch(app, str(params["id"]), conn=conn)


async def acreate_batch(app: App, params: dict[str, object], conn: object | None) -> AsyncBatch:
    raw = await adriver_connection(conn) if conn is not None else None
    backends = await app.async_backends()
    with app.connections.postgres_errors():
        await AsyncBatchStore(backends.store).create(params, raw)
    return AsyncBatch(app, str(params["id"]), conn=conn)


def batch_status(app: App, batch_id: str, failures: int = FAILURES_SHOWN) -> BatchStatus:
    """The batch's counters, state and first `failures` failed members; BatchNotFound."""
    if not isinstance(batch_id, str) or not 1 <= len(batch_id) <= 255 or "\x00" in batch_id:
        raise BatchInvalid("id", f"must be a string of 1-255 characters, not {batch_id!r:.80}")
    if isinstance(failures, bool) or not isinstance(failures, int) or failures < 0:
        raise BatchInvalid("failures", f"must be a count of 0 or more, not {failures!r:.80}")
    with app.connections.postgres_errors():
        status = BatchStore(app.read_store).status(batch_id, failures)
    if status is None:
        raise BatchNotFound(batch_id)
    return status


def job_batch(app: App, job_id: str) -> Batch | None:
    """The batch a running job belongs to, as a handle that may add to it while it runs."""
    with app.connections.postgres_errors():
        batch_id = BatchStore(app.store).batch_of_job(job_id)
    return None if batch_id is None else Batch(app, batch_id, adder=job_id)
