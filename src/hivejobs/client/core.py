"""Core: what an App's calls run on, behind the facade: its connections, the job types it can
name (registered here, or declared in Postgres by a running worker fleet), and the two sides
of the enqueue pipeline (client/enqueue.py) over those connections.

`Mode` is what the App's enqueue and job reads delegate to: a Core (the servers), or the
inline testing mode (client/inline.py), which serves the same calls from this process.
Never decides anything about jobs: jobtypes.py checks them, store/ stores them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

import psycopg

from hivejobs.client.connections import Connections
from hivejobs.client.enqueue import AsyncSide, Side, SyncSide
from hivejobs.errors import JobNotFound, UnknownJobType
from hivejobs.jobtypes import JobType, JobTypeSpec, declared_type
from hivejobs.payload_schema import RemoteSchemas
from hivejobs.records.jobs import JobInfo, JobTypeInfo
from hivejobs.serialization import decode_json

if TYPE_CHECKING:
    from hivejobs.config import Settings

DECLARED_TYPES_FRESH_S = 5.0  # how long a read of the fleet's declared types is reused


class Mode(Protocol):
    """Where enqueued jobs go and job reads come from: `side` for the sync calls, `aside`
    for the async ones (client/enqueue.py)."""

    @property
    def side(self) -> Side: ...
    @property
    def aside(self) -> Side: ...
    def get_job(self, job_id: str) -> JobInfo: ...
    async def aget_job(self, job_id: str) -> JobInfo: ...


class Core:
    """The App's plumbing. Owns `connections` (opened on first use), the enqueue sides over
    them, and a short cache of the types a worker fleet declared (`_declared`, replaced
    whole, so a racing reader sees an old or a new map, never half of one). `types` is the
    App's registry, read here, filled by `@app.job` while the app module is imported."""

    def __init__(self, settings: Settings, types: Mapping[str, JobType]) -> None:
        self.settings = settings
        self.types = types
        self.connections = Connections(settings)
        self.side = SyncSide(self.connections, self.job_type)
        self.aside = AsyncSide(self.connections, self.ajob_type)
        self._declared: tuple[float, dict[str, JobTypeInfo]] = (0.0, {})
        self._schemas = RemoteSchemas()

    def job_type(self, name: str) -> JobTypeSpec:
        """A registered type, or one a running worker fleet declared in Postgres (CLI use)."""
        jt = self.types.get(name)
        if jt is not None:
            return jt
        declared = self._declared_types()
        info = declared.get(name)
        if info is None:
            raise UnknownJobType(name, sorted(set(self.types) | set(declared)))
        # The payload schema its worker declared: checked here as the worker would.
        store = self.connections.store
        return declared_type(
            info, self._schemas.codec(store, name, self.settings.max_payload_bytes)
        )

    async def ajob_type(self, name: str) -> JobTypeSpec:
        """A registered type at once; a declared one is read in a thread (it may query)."""
        jt = self.types.get(name)
        if jt is not None:
            return jt
        return await asyncio.to_thread(self.job_type, name)

    def _declared_types(self) -> dict[str, JobTypeInfo]:
        at, cached = self._declared
        if time.monotonic() - at > DECLARED_TYPES_FRESH_S:
            try:
                cached = {t.name: t for t in self.connections.store.job_types()}
            except psycopg.OperationalError:
                if not cached:
                    raise
                return cached  # a stale list beats failing while Postgres blinks
            self._declared = (time.monotonic(), cached)
        return cached

    def get_job(self, job_id: str) -> JobInfo:
        return job_info(job_id, self.connections.store.get_row(job_id))

    async def aget_job(self, job_id: str) -> JobInfo:
        backends = await self.connections.async_backends()
        with self.connections.postgres_errors():
            return job_info(job_id, await backends.store.get_row(job_id))


def job_info(job_id: str, row: dict[str, Any] | None) -> JobInfo:
    """A job's row (store/enqueue.py's get_plan) as the JobInfo the App returns."""
    if row is None:
        raise JobNotFound(job_id)
    row["payload"] = decode_json(bytes(row["payload"]), row["name"])
    row["result"] = decode_json(bytes(row["result"]) if row["result"] else None, row["name"])
    return JobInfo(**row)
