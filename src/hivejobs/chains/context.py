"""What a handler sees of its chain: ctx.chain, ctx.upstream, ctx.set_status.

Loaded from Postgres on first use, by the try's job id, so plain jobs never pay for it.
Writes only the status line, and only while this try is the chain job's current one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec

from hivejobs.errors import NotAnAncestor
from hivejobs.serialization import decode_json

if TYPE_CHECKING:
    from hivejobs.store.chains import ChainStore

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


class ChainView:
    """One try's view of its chain, behind ctx.chain, ctx.upstream and ctx.set_status.

    Owns the try's place in the chain (read once, by job id), its predecessors' keys and, on
    first `result_of`, its ancestors' keys: a try reads only results that exist before it
    starts. Used by the one handler thread of the try, so it holds no lock."""

    def __init__(self, chains: ChainStore, job_id: str) -> None:
        self._chains = chains
        self._job_id = job_id
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

    def set_status(self, text: str) -> None:
        if self.info is not None:
            self._chains.set_status(self._job_id, str(text)[:MAX_STATUS])
