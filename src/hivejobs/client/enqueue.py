"""The enqueue pipeline, written once for every way a job comes in: `App.enqueue` and
`enqueue_many`, their async forms, a batch's (`Batch`, `AsyncBatch`) and the inline testing mode.

A plan (`enqueue_plan`, `enqueue_many_plan`) holds the steps and the decisions between them:
find the type, check the job (bad input raises before any write), store it on a pool's
connection or the caller's `conn=`, read the insert's outcome, push the id to Redis. It asks a
*side* for each step that touches the outside and yields what the side returned: a sync side
does the step at once and returns its value, an async side returns an awaitable. `run` and
`arun` drive a plan, as store/sql.py's runners drive the store's plans of statements: the
sync and async forms share every decision and differ only in their I/O.

A push that fails is logged and left to the coordinator's reconciler (broker/hints.py):
the job is acknowledged once Postgres has it. Never commits, rolls back or closes a caller's
connection (store/enqueue.py says how the caller's transaction is used).
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Generator, Iterable, Sequence
from datetime import datetime
from inspect import isawaitable
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, TypeVar

from hivejobs import tracing
from hivejobs.broker.fair import place
from hivejobs.broker.hints import left_to_reconciler
from hivejobs.client.integrations import adriver_connection, driver_connection
from hivejobs.failpoints import failpoint
from hivejobs.records.dispatch import Push
from hivejobs.records.jobs import Inserted, NewJob
from hivejobs.store.batches import AsyncBatchStore, BatchStore
from hivejobs.store.enqueue import owns_transaction

if TYPE_CHECKING:
    from hivejobs.client.connections import Connections
    from hivejobs.client.integrations import AsyncConn, Conn
    from hivejobs.jobtypes import JobTypeSpec

T = TypeVar("T")
# Yields a side's answer to a step (a value, or an awaitable of it); is sent the value.
Plan = Generator[Any, Any, T]


class Into(NamedTuple):
    """The batch the jobs join; `adder` is the running member that adds them, if any."""

    batch_id: str
    adder: str | None


class Side(Protocol):
    """The I/O of an enqueue. Each method returns its value (a sync side) or an awaitable of
    it (an async side); the plans say which value each is."""

    def job_type(self, name: str) -> object: ...  # JobTypeSpec
    def errors(self) -> contextlib.AbstractContextManager[None]: ...
    def connection(self, conn: object) -> object: ...  # the driver connection behind `conn`
    def insert(self, into: Into | None, job: NewJob, explicit_id: bool, raw: Any) -> object: ...
    def insert_many(self, into: Into | None, jobs: list[NewJob], raw: Any) -> object: ...
    def push_one(self, push: Push) -> object: ...
    def push_many(self, jt: JobTypeSpec, jobs: Sequence[NewJob], pushes: list[Push]) -> object: ...


# -- the plans ---------------------------------------------------------------------------------


def enqueue_plan(
    side: Side,
    into: Into | None,
    name: str,
    payload: object,
    job_id: str | None,
    priority: int | None,
    delay: float | None,
    run_at: datetime | None,
    expires_at: datetime | None,
    conn: object | None,
) -> Plan[str]:
    """One job; returns the id `enqueue` returns (JobTypeSpec.outcome says which)."""
    with side.errors():
        jt: JobTypeSpec = yield side.job_type(name)
    job = jt.new_job(payload, job_id, priority, delay, run_at, expires_at)
    raw = None if conn is None else (yield side.connection(conn))
    own = raw is None or owns_transaction(raw)
    with side.errors(), tracing.enqueueing(job) as job:
        # On an error the job is not acknowledged; if the connection died during COMMIT
        # it may be stored: enqueue again with the same id to be sure (idempotent).
        inserted: Inserted = yield side.insert(into, job, job_id is not None, raw)
    stored_id, created = jt.outcome(job, inserted)
    # In the caller's transaction the commit dispatches it (NOTIFY): nothing to push.
    if created and own:
        failpoint("enqueue.after_commit_before_push")
        yield side.push_one(Push(stored_id, job.name, inserted.priority))
    return stored_id


def enqueue_many_plan(
    side: Side,
    into: Into | None,
    name: str,
    payloads: Iterable[object],
    priority: int | None,
    delay: float | None,
    expires_at: datetime | None,
    conn: object | None,
) -> Plan[list[str]]:
    """Every payload checked first (one bad one stores nothing), then one COPY."""
    with side.errors():
        jt: JobTypeSpec = yield side.job_type(name)
    jobs = jt.new_jobs(payloads, priority, delay, expires_at)
    if not jobs:
        return []
    raw = None if conn is None else (yield side.connection(conn))
    with side.errors(), tracing.enqueueing_many(jobs) as jobs:
        pushes: list[Push] = yield side.insert_many(into, jobs, raw)
    if pushes:  # none in the caller's transaction, whose commit dispatches them
        yield side.push_many(jt, jobs, pushes)
    return [j.id for j in jobs]


def run(plan: Plan[T]) -> T:
    """Drive a plan over a sync side: each step's value is already there."""
    try:
        value = next(plan)
        while True:
            value = plan.send(value)
    except StopIteration as done:
        result: T = done.value
        return result


async def arun(plan: Plan[T]) -> T:
    """Drive a plan over an async side: await each step, and raise what it raised inside the
    plan, where its `with` blocks (the enqueue span, the error translation) see it. A step
    that is not awaitable is its value (the inline mode serves both forms with one side)."""
    try:
        step = next(plan)
        while True:
            if isawaitable(step):
                try:
                    value = await step
                except BaseException as exc:  # into the plan; it comes out again from throw
                    step = plan.throw(exc)
                    continue
            else:
                value = step
            step = plan.send(value)
    except StopIteration as done:
        result: T = done.value
        return result


# -- the sides ---------------------------------------------------------------------------------


class SyncSide:
    """Steps on the App's sync connections (a thread-safe pool, one pusher thread)."""

    def __init__(self, connections: Connections, job_type: Callable[[str], JobTypeSpec]) -> None:
        self._connections = connections
        self.job_type = job_type

    def errors(self) -> contextlib.AbstractContextManager[None]:
        return self._connections.postgres_errors()

    def connection(self, conn: object) -> Conn:
        return driver_connection(conn)

    def insert(self, into: Into | None, job: NewJob, explicit_id: bool, raw: Any) -> Inserted:
        store = self._connections.store
        if into is None:
            return store.insert_job(job, explicit_id, raw)
        return BatchStore(store).add_one(into.batch_id, into.adder, job, explicit_id, raw)

    def insert_many(self, into: Into | None, jobs: list[NewJob], raw: Any) -> list[Push]:
        store = self._connections.store
        if into is None:
            return store.insert_many(jobs, raw)
        return BatchStore(store).add_many(into.batch_id, into.adder, jobs, raw)

    def push_one(self, push: Push) -> None:
        """Off the caller's path: the pusher's thread sends it (and logs its own failure)."""
        self._connections.pusher.submit(push.name, push.priority, [push.id])

    def push_many(self, jt: JobTypeSpec, jobs: Sequence[NewJob], pushes: list[Push]) -> None:
        """One call's jobs: one type at one priority. A fair type's go straight into their
        keys' lists (broker/fair.py): the keys are in hand here, so no pool has to read them
        back from Postgres."""
        broker = self._connections.broker
        with left_to_reconciler("enqueued jobs", job_type=jt.name, jobs=len(pushes)):
            if jt.fair is None:
                broker.push(jt.name, pushes[0].priority, [p.id for p in pushes])
                return
            keys = {j.id: jt.fair.key_of(j.payload) for j in jobs}
            place(broker, jt.name, [(p.id, p.priority, keys[p.id]) for p in pushes])


class AsyncSide:
    """Steps on the current event loop's async connections (client/aio.py)."""

    def __init__(
        self, connections: Connections, job_type: Callable[[str], Awaitable[JobTypeSpec]]
    ) -> None:
        self._connections = connections
        self.job_type = job_type

    def errors(self) -> contextlib.AbstractContextManager[None]:
        return self._connections.postgres_errors()

    async def connection(self, conn: object) -> AsyncConn:
        return await adriver_connection(conn)

    async def insert(self, into: Into | None, job: NewJob, explicit_id: bool, raw: Any) -> Inserted:
        store = (await self._connections.async_backends()).store
        if into is None:
            return await store.insert_job(job, explicit_id, raw)
        return await AsyncBatchStore(store).add_one(
            into.batch_id, into.adder, job, explicit_id, raw
        )

    async def insert_many(self, into: Into | None, jobs: list[NewJob], raw: Any) -> list[Push]:
        store = (await self._connections.async_backends()).store
        if into is None:
            return await store.insert_many(jobs, raw)
        return await AsyncBatchStore(store).add_many(into.batch_id, into.adder, jobs, raw)

    async def push_one(self, push: Push) -> None:
        await self.push_many(None, (), [push])

    async def push_many(
        self, jt: JobTypeSpec | None, jobs: Sequence[NewJob], pushes: list[Push]
    ) -> None:
        """Into the type's list, a fair type's too: its pools sort them into their keys."""
        broker = (await self._connections.async_backends()).broker
        _, name, priority = pushes[0]  # one call enqueues one type at one priority
        with left_to_reconciler("enqueued jobs", job_type=name, jobs=len(pushes)):
            await broker.push(name, priority, [p.id for p in pushes])
