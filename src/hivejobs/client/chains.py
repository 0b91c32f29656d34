"""ChainClient: the App's chain calls (run, status, stop, job log, listings, ps).

run validates everything (DAG, sequences, job types, payloads, typed args) before the one
transaction that stores the chain; the coordinator's traverser does the rest. stop flags the
chain with its stop deadline and tells running tries to stop over the control channel; a
Redis failure there only delays the stop (the tries end cancelled whenever they fail or
finish, and the traverser abandons what still runs at the deadline).

ChainClient knows nothing of the App: it is handed a store, the broker and the job-type
lookup. ChainCalls, the App's chain methods, make one per call over the App's Core.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, get_args

import msgspec
import redis
from loguru import logger

from hivejobs import tracing
from hivejobs.broker.channels import ControlMessage
from hivejobs.chains.builder import Chain
from hivejobs.chains.checks import job_row
from hivejobs.client.integrations import adriver_connection, driver_connection
from hivejobs.errors import (
    ChainInvalid,
    ChainNotFound,
    ChainStopPending,
    InvalidArgument,
)
from hivejobs.logs import error_fields
from hivejobs.records.chains import (
    ChainJobStatus,
    ChainQuery,
    ChainState,
    ChainStatus,
    ChainSummary,
    JobLogEntry,
    RunningTry,
)
from hivejobs.serialization import decode_json, encode_json
from hivejobs.store.chains import ChainStore

if TYPE_CHECKING:
    from hivejobs.broker import Broker
    from hivejobs.client.core import Core
    from hivejobs.jobtypes import JobTypeSpec
    from hivejobs.store import Store

_REQUEST_ID_RE = re.compile(r"[0-9a-f]{32}")
MAX_LIST = 10_000
MAX_STOP_TIMEOUT_S = 24 * 3600.0
WAIT_MARGIN_S = 15.0  # a traverser pass after the stop timeout, with room for a failover


class PreparedChain(msgspec.Struct, frozen=True):
    """A chain that passed every check, as the rows that store it."""

    request_id: str
    head: dict[str, Any]
    jobs: list[dict[str, Any]]
    sequences: list[dict[str, Any]]


class ChainClient:
    """The chain calls of one App, over the store and the broker it is handed.

    Owns no state but its references: `store` (writes, and the reads that decide them),
    `read_store` (listings, maybe a replica), the broker (opened on first use: only stop and
    a wake-up behind a pooler need Redis) and `job_type`, the App's lookup of registered or
    declared types, so that a chain's jobs are checked as `enqueue` checks a job."""

    def __init__(
        self,
        store: Store,
        broker: Callable[[], Broker],
        job_type: Callable[[str], JobTypeSpec],
        *,
        read_store: Store | None = None,
        stop_timeout_s: float = 30.0,
        wake_over_redis: bool = False,
    ) -> None:
        self._chains = ChainStore(store)
        self._read = ChainStore(read_store or store)
        self._broker = broker
        self._job_type = job_type
        self._stop_timeout_s = stop_timeout_s
        # Behind a transaction pooler no coordinator hears the NOTIFY: say it over Redis.
        self._wake_over_redis = wake_over_redis

    def run(self, chain: Chain, conn: object | None = None) -> str:
        """Validate, store in one transaction (the caller's with `conn`), wake the traverser
        on commit; returns the request id."""
        ready = self.prepare(chain)
        raw = driver_connection(conn) if conn is not None else None
        with tracing.submitting_chain(ready.head) as head:
            self._chains.create(head, ready.jobs, ready.sequences, raw)
        logger.info(
            "chain stored", chain_id=ready.request_id, chain=chain.name, jobs=len(ready.jobs)
        )
        if raw is None and self._wake_over_redis:
            try:
                self._broker().publish_wake([ready.request_id])
            except redis.RedisError as exc:
                logger.warning("chain wake-up not published; found within a second", error=str(exc))
        return ready.request_id

    def prepare(self, chain: Chain) -> PreparedChain:
        """Check everything (DAG, sequences, job types, payloads) before anything is stored."""
        if not isinstance(chain, Chain):
            raise ChainInvalid(f"run_chain takes a hivejobs.Chain, not {type(chain).__name__}")
        valid = chain.validate()
        args = _checked_args(chain)
        jobs = [
            job_row(chain.jobs[key], valid.sequence_of.get(key), self._job_type)
            for key in valid.order
        ]
        sequences = [
            {"start": start, "retries": s.retries, "retry_wait_s": s.retry_wait_s}
            for start, s in valid.starts.items()
        ]
        request_id = uuid.uuid4().hex
        head = {
            "id": request_id,
            "name": chain.name,
            "args": args,
            "jobs": len(jobs),
            "trace_context": None,  # set by tracing.submitting_chain when traced
        }
        return PreparedChain(request_id, head, jobs, sequences)

    def status(self, request_id: str) -> ChainStatus:
        check_request_id(request_id)
        found = self._chains.get(request_id)
        if found is None:
            raise ChainNotFound(request_id)
        head, rows = found
        jobs = []
        for row in rows:
            row["try_"] = row.pop("try")
            row["result"] = decode_json(bytes(row["result"]) if row["result"] is not None else None)
            jobs.append(ChainJobStatus(**row))
        head["args"] = decode_json(bytes(head["args"]))
        return ChainStatus(**head, jobs=jobs)

    def stop(self, request_id: str, timeout: float | None = None, wait: bool = False) -> bool:
        """Stop a live chain: nothing new starts, running tries are told to stop, and the chain
        ends `stopped` once they have (`failed` if a job had failed for good). Tries still
        running `timeout` seconds later are abandoned. False when it had already finished."""
        check_request_id(request_id)
        timeout_s = self._stop_timeout_s if timeout is None else timeout
        if (
            isinstance(timeout_s, bool)
            or not isinstance(timeout_s, int | float)
            or not (0 <= timeout_s <= MAX_STOP_TIMEOUT_S)
        ):
            raise InvalidArgument(
                f"stop timeout must be 0-{MAX_STOP_TIMEOUT_S:.0f} seconds, not {timeout_s!r}"
            )
        live, running = self._chains.request_stop(request_id, timeout_s)
        if not live:
            self.status(request_id)  # raises ChainNotFound for unknown ids
            return False
        for job_id in running:
            try:
                self._broker().publish_control(ControlMessage(action="cancel", job_id=job_id))
            except redis.RedisError as exc:
                logger.warning(
                    "chain stop stored but not broadcast; its running jobs end "
                    "cancelled when they fail",
                    chain_id=request_id,
                    **error_fields(exc),
                )
                break
        logger.info("chain stop requested", chain_id=request_id, running=len(running))
        if wait:
            self._wait_stopped(request_id, timeout_s)
        return True

    def _wait_stopped(self, request_id: str, timeout_s: float) -> None:
        """Until the chain has ended: every try ended or was abandoned. The traverser ends it
        within the stop timeout plus a pass; a chain still live well after that (no coordinator
        runs anywhere) raises rather than blocking for ever."""
        deadline = time.monotonic() + timeout_s + WAIT_MARGIN_S
        while True:
            state = self.status(request_id).state
            if state in ("succeeded", "failed", "stopped"):
                return
            if time.monotonic() > deadline:
                raise ChainStopPending(request_id, state)
            time.sleep(0.1)

    def job_log(self, request_id: str) -> list[JobLogEntry]:
        """Every try, with its captured output (stdout, stderr: bounded tails)."""
        check_request_id(request_id)
        rows = self._chains.job_log(request_id)
        if not rows:
            self.status(request_id)  # raises ChainNotFound for unknown ids
        out = []
        for row in rows:
            row["try_"] = row.pop("try")
            out.append(JobLogEntry(**row))
        return out

    def list_chains(self, query: ChainQuery) -> list[ChainSummary]:
        return [ChainSummary(**row) for row in self._read.list_chains(query)]

    def running_tries(self, limit: int = 500) -> list[RunningTry]:
        """spincycle's `ps`: every try of every live chain now, across the fleet."""
        rows = self._chains.running_tries(limit)
        for row in rows:
            row["try_"] = row.pop("try")
        return [RunningTry(**row) for row in rows]


def _checked_args(chain: Chain) -> bytes:
    """Encode the chain's args; with a Struct type, validated by a round trip through its
    decoder, as payloads are (a Struct built without checks is checked here)."""
    value = chain.args
    target = chain.args_type
    if target is None and isinstance(value, msgspec.Struct):
        target = type(value)
    if target is None and not isinstance(value, dict):
        raise ChainInvalid(f"chain {chain.name!r}: args must be a dict or a msgspec.Struct")
    raw = encode_json(value, lambda why: ChainInvalid(f"chain {chain.name!r}: args: {why}"))
    if target is not None:
        try:
            raw = encode_json(
                msgspec.json.decode(raw, type=target),
                lambda why: ChainInvalid(f"chain {chain.name!r}: args: {why}"),
            )
        except msgspec.ValidationError as exc:
            raise ChainInvalid(
                f"chain {chain.name!r}: args do not fit {target.__name__}: {exc}"
            ) from None
    return raw


def check_request_id(request_id: object) -> str:
    """Request ids are uuid4 hex (run_chain makes them): anything else names no chain."""
    if not isinstance(request_id, str):
        raise InvalidArgument(f"a chain request id is a string, not {type(request_id).__name__}")
    if not _REQUEST_ID_RE.fullmatch(request_id):
        raise ChainNotFound(request_id)
    return request_id


_STATES: dict[str, ChainState] = {s: s for s in get_args(ChainState)}


def chain_query(
    state: str | Sequence[str] | None,
    type_: str | None,
    job_type: str | None,
    since: datetime | None,
    until: datetime | None,
    before: tuple[datetime, str] | None,
    limit: int,
) -> ChainQuery:
    """The filters of list_chains, checked: an unknown state names the known ones."""
    wanted = [state] if isinstance(state, str) else list(state or ())
    unknown = [s for s in wanted if s not in _STATES]
    if unknown:
        raise InvalidArgument(f"unknown chain state {unknown[0]!r} (states: {', '.join(_STATES)})")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIST:
        raise InvalidArgument(f"limit must be an integer 1-{MAX_LIST}, not {limit!r}")
    return ChainQuery(
        states=[_STATES[s] for s in wanted] or None,
        type=type_,
        job_type=job_type,
        since=since,
        until=until,
        before=before,
        limit=limit,
    )


class ChainCalls:
    """The App's chain calls (a part of the App's facade), each over a ChainClient."""

    _core: Core

    def _chains(self) -> ChainClient:
        """Made per call over the current store: `close()` may have replaced it."""
        return ChainClient(
            self._core.connections.store,
            lambda: self._core.connections.broker,
            self._core.job_type,
            read_store=self._core.connections.read_store,
            stop_timeout_s=self._core.settings.chain_stop_timeout_s,
            wake_over_redis=self._core.settings.pgbouncer
            and not self._core.settings.listen_database_url,
        )

    def run_chain(self, chain: Chain, conn: object | None = None) -> str:
        """Validate and store a chain (ChainInvalid stores nothing); returns its request id.
        `conn`: in the caller's transaction, with the rules of `enqueue`."""
        return self._chains().run(chain, conn)

    async def arun_chain(self, chain: Chain, conn: object | None = None) -> str:
        """`run_chain` for event loops: `conn` is an async connection, or None."""
        chains = await asyncio.to_thread(self._chains)  # may open the store
        ready = await asyncio.to_thread(chains.prepare, chain)  # may read declared types
        raw = await adriver_connection(conn) if conn is not None else None
        backends = await self._core.connections.async_backends()
        with tracing.submitting_chain(ready.head) as head:
            await backends.store.create_chain(head, ready.jobs, ready.sequences, raw)
        logger.info(
            "chain stored", chain_id=ready.request_id, chain=chain.name, jobs=len(ready.jobs)
        )
        return ready.request_id

    def chain_status(self, request_id: str) -> ChainStatus:
        return self._chains().status(request_id)

    def stop_chain(self, request_id: str, timeout: float | None = None, wait: bool = False) -> bool:
        """Stop a live chain; False when it had already finished. It ends `stopped`, or
        `failed` when one of its jobs had failed for good. Tries that ignore ctx.stopping
        are abandoned after `timeout` seconds (default `chain_stop_timeout_s`, 30) and the
        job log says so. `wait`: return once every try has ended (or was abandoned)."""
        return self._chains().stop(request_id, timeout, wait)

    def job_log(self, request_id: str) -> list[JobLogEntry]:
        """One entry per try of every job of the chain, in the order they finished."""
        return self._chains().job_log(request_id)

    def list_chains(
        self,
        limit: int = 50,
        *,
        state: str | Sequence[str] | None = None,
        type: str | None = None,  # the chain's name, spincycle's request type
        job_type: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        before: tuple[datetime, str] | None = None,
    ) -> list[ChainSummary]:
        """Chains newest first, filtered by state(s), type (the chain's name), job type and
        creation time; `before` = (created_at, id) of the last chain of a previous page."""
        query = chain_query(state, type, job_type, since, until, before, limit)
        return self._chains().list_chains(query)

    def chain_ps(self, limit: int = 500) -> list[RunningTry]:
        """What runs now across the fleet (spincycle's `ps`): each live chain try with its
        host, pid, status text and age."""
        return self._chains().running_tries(limit)
