"""App: the facade web processes and workers import: the job-type registry (client/registry.py),
enqueue (one pipeline, client/enqueue.py, sync and async), reads, control, chains and batches.

enqueue: validate -> serialization -> store (commit) -> broker (push id). Validation happens
before the first write, so bad input stores nothing. A Redis failure after the commit is
logged and left to the coordinator's reconciler: the job is acknowledged once Postgres has it.
The plumbing (connections, the lookup of declared types, the enqueue sides) is one Core
(client/core.py); `App(testing="inline")` delegates enqueue and job reads to an InlineRunner.

JobContext, a handler's view of its job, lives here too: its `app` is the App (typed, for
handlers that enqueue more work) and the App builds it for the worker (`job_context`), so the
two refer to each other. It reaches its chain through the ChainStore it is handed (the pool
process's own connection pool), never through the App's: a pool process opens no second pool.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Literal

from hivejobs.client.batches import Batch, BatchCalls
from hivejobs.client.chains import ChainCalls
from hivejobs.client.connections import Connections
from hivejobs.client.control import Control
from hivejobs.client.core import Core, Mode
from hivejobs.client.enqueue import arun, enqueue_many_plan, enqueue_plan, run
from hivejobs.client.inline import InlineRunner, Stored, checked_mode
from hivejobs.client.registry import Registry
from hivejobs.client.streaming import Streams
from hivejobs.config import settings_from_env
from hivejobs.errors import UsageError
from hivejobs.jobtypes import JobTypeSpec, check_id
from hivejobs.records.jobs import ClaimedJob, JobInfo, JobPage
from hivejobs.worker.context import AttemptContext

if TYPE_CHECKING:
    from hivejobs.chains.context import ChainInfo, ChainView
    from hivejobs.store.chains import ChainStore
    from hivejobs.worker.streaming import EventSink


class App(Registry, Control, Streams, ChainCalls, BatchCalls):
    """Register job types with @app.job; enqueue from anywhere the app is importable.

    A facade, its calls grouped by role in the modules of its bases (registry, control,
    streams, chains, batches); the checks live in jobtypes.py, the plumbing in one Core
    (whose `connections` hivejobs' own layers and tests reach the store and the broker
    through), the SQL in store/. It owns the registry (`types` and `schedules`, filled
    while the app module is imported, read-only afterwards)."""

    def __init__(
        self,
        database_url: str | None = None,
        redis_url: str | None = None,
        prefix: str | None = None,
        *,
        testing: Literal["inline"] | None = None,
        **settings: float | int | str,
    ) -> None:
        """`testing="inline"`: for tests, `enqueue` runs each job at once in the caller with
        no Postgres or Redis (hivejobs.client.inline says what differs)."""
        self.settings = settings_from_env(database_url, redis_url, prefix, **settings)
        self.types = {}
        self.schedules = {}
        self.process_start_hooks = []
        self._core = Core(self.settings, self.types)
        self._mode: Mode = self._core
        self.testing = testing  # `hivejobs run` refuses such an app: it has nothing to serve
        if testing is not None:
            checked_mode(testing)
            self._mode = InlineRunner(self.types, self.settings.max_result_bytes, self.job_context)

    def job_type(self, name: str) -> JobTypeSpec:
        """A registered type, or one a running worker fleet declared in Postgres (CLI use)."""
        return self._core.job_type(name)

    @contextlib.contextmanager
    def inline_mode(self, run: Callable[[str, Sequence[str]], object]) -> Iterator[None]:
        """For hivejobs.testing.inline: inside the block, `enqueue` stores each job and pushes
        its id as usual, then hands a job stored outside the caller's transaction to `run`
        (claim, execute, finish) before returning: the inline runner over this App's
        database (client/inline.py's Stored). Switch it while no other thread enqueues."""
        before = self._mode
        stored = Stored(self._core, run)
        max_bytes = self.settings.max_result_bytes
        self._mode = InlineRunner(self.types, max_bytes, self.job_context, stored)
        try:
            yield
        finally:
            self._mode = before

    def job_context(
        self, job: ClaimedJob, chains: ChainStore | None = None, events: EventSink | None = None
    ) -> JobContext:
        """The context a handler of this app is handed for `job`'s attempt: built by the
        worker (worker/served.py: what it needs of the App), inline mode and hivejobs.testing.
        `chains` is the store of the process running the handler (else the App's)."""
        return JobContext(job, self, chains, events)

    # -- connections (Core owns them) ----------------------------------------------------

    @property
    def connections(self) -> Connections:
        """The App's Postgres stores, Redis broker and id pusher, opened on first use: for
        hivejobs' own layers (worker, web, CLI) and tests, not a user API."""
        return self._core.connections

    def migrate(self) -> list[str]:
        """Create the database if missing and apply pending migrations (idempotent)."""
        return self._core.connections.migrate()

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait until the ids of jobs enqueued so far were pushed to Redis."""
        return self._core.connections.flush(timeout_s)

    def close(self) -> None:
        self._core.connections.close()

    async def aclose(self) -> None:
        """Close this event loop's async connections (from the web app's shutdown hook)."""
        await self._core.connections.aclose()

    # -- enqueue (client/enqueue.py: one pipeline, run over a sync or an async side) ---------

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
        """Store the job and dispatch it; returns its id.

        The same id with the same payload returns the existing job; a different payload
        raises JobIdConflict.

        `conn` puts the job in the caller's transaction: a psycopg `Connection`, a SQLAlchemy
        `Connection` or `Session` (postgresql+psycopg), or Django's `connection`. hivejobs
        never commits, rolls back or closes it: the job exists, and is dispatched (NOTIFY,
        delivered on commit), only if the caller commits. The one exception is an autocommit
        connection with no transaction open, where the enqueue is its own transaction.
        """
        side = self._mode.side
        return run(
            enqueue_plan(side, None, name, payload, id, priority, delay, run_at, expires_at, conn)
        )

    async def aenqueue(
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
        """`enqueue` for event loops; `conn` is a psycopg `AsyncConnection` or a SQLAlchemy
        `AsyncConnection` / `AsyncSession`, with the same transaction rules."""
        side = self._mode.aside
        return await arun(
            enqueue_plan(side, None, name, payload, id, priority, delay, run_at, expires_at, conn)
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
        """Validate every payload first (one bad one stores nothing), then COPY them in, in
        `conn`'s transaction if given (as `enqueue`)."""
        side = self._mode.side
        return run(enqueue_many_plan(side, None, name, payloads, priority, delay, expires_at, conn))

    async def aenqueue_many(
        self,
        name: str,
        payloads: Iterable[object],
        *,
        priority: int | None = None,
        delay: float | None = None,
        expires_at: datetime | None = None,
        conn: object | None = None,
    ) -> list[str]:
        """`enqueue_many` for event loops."""
        side = self._mode.aside
        return await arun(
            enqueue_many_plan(side, None, name, payloads, priority, delay, expires_at, conn)
        )

    def get_job(self, job_id: str) -> JobInfo:
        check_id(job_id)
        return self._mode.get_job(job_id)

    async def aget_job(self, job_id: str) -> JobInfo:
        check_id(job_id)
        return await self._mode.aget_job(job_id)

    # -- reads and user actions --------------------------------------------------------

    def list_jobs(
        self,
        state: str | Sequence[str] | None = None,
        type: str | None = None,  # the job type, as the CLI's --type
        since: datetime | timedelta | None = None,
        until: datetime | None = None,
        limit: int = 100,
        after: str | None = None,
    ) -> JobPage:
        """Live and archived jobs, newest first (by finished_at, or created_at while live),
        filtered by state(s), job type and time; `since` is a moment or a span back from
        now (judged on the database clock). Keyset-paginated: pass the page's `next` as
        `after`. A job that finishes while you page may appear on two pages."""
        from hivejobs.client.listing import list_jobs

        return list_jobs(self.connections.store, state, type, since, until, limit, after)


class JobContext(AttemptContext):
    """Handed to every handler call: the attempt's identity, its stop flag, its chain.

    `stopping` is set when the worker shuts down, the job is cancelled, or its timeout passed:
    a long handler should check it and raise `hivejobs.Interrupted` (or return) promptly.
    Owns, beyond the attempt's stop flag (AttemptContext), the chain view and the batch
    handle, each loaded on first use. `app` is there for handlers that enqueue more work;
    the chain view uses `chains`, the store of the process running the handler.
    """

    def __init__(
        self,
        job: ClaimedJob,
        app: App,
        chains: ChainStore | None = None,
        events: EventSink | None = None,
    ) -> None:
        super().__init__(job, events)
        self.app = app
        self._chains = chains
        self._chain: ChainView | None = None
        self._batch: tuple[Batch | None] | None = None  # looked up on first use

    # -- chains: loaded on first use, so plain jobs never pay for them ------------------

    @property
    def chain(self) -> ChainInfo | None:
        """The chain this job runs in (request id, args, key, try number); None if none."""
        return self._chain_view().info

    @property
    def upstream(self) -> dict[str, object]:
        """The results of this chain job's predecessors, by key ({} for a plain job)."""
        return self._chain_view().upstream()

    def set_status(self, text: str) -> None:
        """A live status line for `hivejobs chain status` ("copied 40%"); plain jobs: no-op."""
        self._chain_view().set_status(text)

    @property
    def batch(self) -> Batch | None:
        """The batch this job belongs to (None if none), as a handle that may add jobs to it
        while this job runs, even once the batch is sealed: `ctx.batch.enqueue(...)`."""
        if self._batch is None:
            self._batch = (self.app.job_batch(self.job_id),)
        return self._batch[0]

    def _chain_view(self) -> ChainView:
        if self._chain is None:
            from hivejobs.chains.context import ChainView
            from hivejobs.store.chains import ChainStore

            # Without a store of its own (hivejobs.testing runs handlers in the caller's
            # process), the App's: it is the only one there.
            chains = (
                self._chains if self._chains is not None else ChainStore(self.app.connections.store)
            )
            self._chain = ChainView(chains, self.job_id, self.app.job_type)
        return self._chain


def load_app(spec: str) -> App:
    """Import MODULE:ATTR (the current directory is importable, as for a Procfile)."""
    module_name, _, attr = spec.partition(":")
    if not module_name:
        raise UsageError(f"expected MODULE:APP, got {spec!r}")
    if module_name.endswith(".py") or "/" in module_name or os.sep in module_name:
        dotted = module_name.removesuffix(".py").lstrip("./").replace(os.sep, ".")
        raise UsageError(
            f"{spec!r} is a file path; give MODULE:APP, the module's import path and the"
            f" App's name, e.g. {dotted.replace('/', '.')}:{attr or 'app'}"
        )
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(f"cannot import {module_name!r}: {exc}") from None
    name = attr or "app"
    apps = sorted(k for k, v in vars(module).items() if isinstance(v, App))
    found = f"its Apps: {', '.join(apps)}" if apps else "it defines no App"
    if not hasattr(module, name):
        raise UsageError(f"module {module_name!r} has no attribute {name!r} ({found})")
    app = getattr(module, name)
    if not isinstance(app, App):
        raise UsageError(
            f"{module_name}:{name} is a {type(app).__name__}, not a hivejobs App ({found})"
        )
    return app
