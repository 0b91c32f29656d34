"""What a handler sees of its chain: ctx.chain, ctx.upstream, ctx.set_status, ctx.chain.add.

Loaded from Postgres on first use, by the try's job id, so plain jobs never pay for it.
Writes the status line and added jobs (chains/growth.py), and only while this try is the
chain job's current one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec
from loguru import logger

from hivejobs.chains.growth import Growth, plan_growth
from hivejobs.errors import ChainInvalid, NotAnAncestor
from hivejobs.serialization import decode_json

if TYPE_CHECKING:
    from hivejobs.chains.checks import JobTypeLookup
    from hivejobs.store.chains import ChainStore, GrowthSnapshot, GrowthWrite

MAX_STATUS = 1000
T = TypeVar("T")


@dataclass(frozen=True)
class ChainInfo:
    """ctx.chain: the chain request this try belongs to."""

    request_id: str
    args: dict[str, Any]
    key: str
    try_number: int  # the job's total try number, as in the job log
    _view: ChainView | None = field(default=None, repr=False, compare=False)
    _raw_args: bytes = field(default=b"{}", repr=False, compare=False)

    def args_as(self, type_: type[T]) -> T:
        """The chain's args decoded as `type_` (the Struct given to Chain(args_type=...))."""
        return msgspec.json.decode(self._raw_args, type=type_)

    def result_of(self, key: str) -> object:
        """The result of any job this one runs after, directly or not (spincycle's job
        data from further up). NotAnAncestor for any other key: its result may not exist."""
        if self._view is None:
            raise NotAnAncestor(key, self.key, [])
        return self._view.result_of(key)

    def grow(self) -> Growth:
        """A builder of jobs to add below this one: `job()` each, then `add()` it."""
        if self._view is None:
            raise ChainInvalid(f"job {self.key!r}: jobs are added from a running chain job")
        return Growth(self.key, self._view.next_position)

    def add(self, growth: Growth) -> list[str]:
        """Store the growth's jobs in the chain, all or none (chains/growth.py says how keys
        make a repeated add after a kill add nothing twice); returns the keys added now."""
        if self._view is None:
            raise ChainInvalid(f"job {self.key!r}: jobs are added from a running chain job")
        return self._view.add(growth)


class ChainView:
    """One try's view of its chain, behind ctx.chain, ctx.upstream, ctx.set_status and
    ctx.chain.add (which also counts the unnamed jobs this try added: their positions).

    Owns the try's place in the chain (read once, by job id), its predecessors' keys and, on
    first `result_of`, its ancestors' keys: a try reads only results that exist before it
    starts. Used by the one handler thread of the try, so it holds no lock."""

    def __init__(
        self, chains: ChainStore, job_id: str, job_type: JobTypeLookup | None = None
    ) -> None:
        self._chains = chains
        self._job_id = job_id
        self._job_type = job_type
        self._positions = 0  # unnamed jobs added by this try so far (Growth.job)
        self._after: list[str] = []
        self._ancestors: set[str] | None = None
        self.info: ChainInfo | None = None
        found = self._chains.try_context(job_id)
        if found is not None:
            chain_id, key, total, after, args = found
            decoded = decode_json(args)
            self.info = ChainInfo(
                chain_id, decoded if isinstance(decoded, dict) else {}, key, total, self, args
            )
            self._after = after

    def upstream(self) -> dict[str, object]:
        """Results of this job's predecessors by key (their return values)."""
        if self.info is None or not self._after:
            return {}
        raw = self._chains.upstream(self.info.request_id, self._after)
        return {key: decode_json(value) for key, value in raw.items()}

    def result_of(self, key: str) -> object:
        assert self.info is not None  # only reachable through self.info
        if self._ancestors is None:
            self._ancestors = self._chains.ancestors(self.info.request_id, self.info.key)
        if key not in self._ancestors:
            raise NotAnAncestor(key, self.info.key, sorted(self._ancestors))
        raw = self._chains.upstream(self.info.request_id, [key])
        return decode_json(raw.get(key))

    def next_position(self) -> int:
        self._positions += 1
        return self._positions

    def add(self, growth: Growth) -> list[str]:
        assert self.info is not None  # only reachable through self.info
        if not isinstance(growth, Growth) or growth.adder != self.info.key:
            raise ChainInvalid(f"job {self.info.key!r}: add() takes what ctx.chain.grow() built")
        if self._job_type is None:
            raise ChainInvalid("adding jobs needs the app's job types: run the job in a pool")
        rows = growth.rows(self._job_type)  # type and payload checks: before any statement

        def decide(snap: GrowthSnapshot) -> GrowthWrite:
            return plan_growth(snap, rows, growth.before)

        written = self._chains.grow(self.info.request_id, self._job_id, decide)
        if written is None:
            raise ChainInvalid(
                f"job {self.info.key!r}: this try no longer runs (stopped, abandoned, rescued, "
                "or its chain ended): nothing added"
            )
        logger.info(
            "chain jobs added",
            chain_id=self.info.request_id,
            added_by=self.info.key,
            jobs=len(written.rows),
            kept=len(rows) - len(written.rows),
        )
        return [row["key"] for row in written.rows]

    def set_status(self, text: str) -> None:
        if self.info is not None:
            self._chains.set_status(self._job_id, str(text)[:MAX_STATUS])
