"""Chain builder: a DAG of jobs in Python or JSON, spincycle's job chain without its specs.

    chain = Chain("provision-db", args={"host": "db1"})
    vm = chain.job("create_vm", {"size": 4}, tries=3)
    sql = chain.job("install_mysql", {}, after=[vm])
    chain.sequence([vm, sql], retries=2, retry_wait=10.0)

Builds data only: nothing here touches Postgres or Redis, and nothing is checked against the
job-type registry (chains.api does that when the chain is run). Local mistakes (a foreign
job reference, a duplicate key) raise at once; the DAG as a whole is checked by validate.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from hivejobs.chains.validate import JobSpec, SequenceSpec, ValidChain, check_key, validate
from hivejobs.errors import ChainInvalid


class ChainJob:
    """A job of one chain, as `after=` and `sequence()` take it."""

    __slots__ = ("chain", "key")

    def __init__(self, chain: Chain, key: str) -> None:
        self.chain = chain
        self.key = key

    def __repr__(self) -> str:
        return f"ChainJob({self.chain.name!r}, {self.key!r})"


class ChainFile(msgspec.Struct, forbid_unknown_fields=True):
    """The JSON form of a chain, as `hivejobs chain run FILE.json` reads it."""

    name: str
    jobs: list[JobFile]
    args: dict[str, Any] = msgspec.field(default_factory=dict)
    sequences: list[SequenceFile] = msgspec.field(default_factory=list)


class JobFile(msgspec.Struct, forbid_unknown_fields=True):
    """One job of a ChainFile: the arguments of `Chain.job`."""

    key: str
    type: str
    payload: Any = None
    after: list[str] = msgspec.field(default_factory=list)
    tries: int = 1
    retry_wait: float = 0.0
    priority: int | None = None


class SequenceFile(msgspec.Struct, forbid_unknown_fields=True):
    """One sequence of a ChainFile: the arguments of `Chain.sequence`."""

    jobs: list[str]
    retries: int = 0
    retry_wait: float = 0.0


class Chain:
    """A named DAG of jobs plus chain-wide args that every handler sees as ctx.chain.args.

    `args` is a dict or a msgspec.Struct; `args_type` (a Struct class, default the type of a
    Struct given as args) validates them at run_chain, as a handler's type validates its
    payloads at enqueue; handlers read them back with `ctx.chain.args_as(type)`.
    """

    def __init__(
        self,
        name: str,
        args: Mapping[str, Any] | msgspec.Struct | None = None,
        *,
        args_type: type[msgspec.Struct] | None = None,
    ) -> None:
        self.name = name
        self.args: dict[str, Any] | msgspec.Struct = (
            args if isinstance(args, msgspec.Struct) else dict(args or {})
        )
        self.args_type = args_type
        self.jobs: dict[str, JobSpec] = {}
        self.sequences: list[SequenceSpec] = []

    def job(
        self,
        type: str,  # the job type
        payload: object = None,
        *,
        after: Iterable[ChainJob | str] = (),
        tries: int = 1,
        retry_wait: float = 0.0,
        key: str | None = None,
        priority: int | None = None,
    ) -> ChainJob:
        """Add a job of a registered type; it runs once every job in `after` succeeded.

        `tries`: tries before the job fails for good (spincycle's retry + 1); `retry_wait`
        seconds between them. `key` names the job in status and to its successors' upstream
        (default: the type, numbered when repeated). `after` may name keys added later.
        """
        if key is None:
            key = type if type not in self.jobs else _next_free(type, self.jobs)
        check_key(key)
        if key in self.jobs:
            raise ChainInvalid(f"chain {self.name!r} already has a job {key!r}")
        deps = tuple(self._key_of(ref, key) for ref in after)
        self.jobs[key] = JobSpec(
            key=key,
            type=type,
            payload=payload,
            after=deps,
            tries=tries,
            retry_wait_s=retry_wait,
            priority=priority,
        )
        return ChainJob(self, key)

    def sequence(
        self, jobs: Iterable[ChainJob | str], *, retries: int = 0, retry_wait: float = 0.0
    ) -> None:
        """Jobs retried as a whole: when one fails for good and `retries` are left, all of
        them go back to pending and the sequence restarts from its start job after
        `retry_wait` seconds."""
        keys = tuple(self._key_of(ref, "sequence") for ref in jobs)
        self.sequences.append(SequenceSpec(jobs=keys, retries=retries, retry_wait_s=retry_wait))

    def _key_of(self, ref: ChainJob | str, user: str) -> str:
        if isinstance(ref, ChainJob):
            if ref.chain is not self:
                raise ChainInvalid(
                    f"{user!r} in chain {self.name!r} refers to job {ref.key!r} of another "
                    f"chain ({ref.chain.name!r}): a chain's jobs depend on its own jobs only"
                )
            return ref.key
        if isinstance(ref, str):
            return ref
        raise ChainInvalid(f"{user!r}: expected a job of this chain or its key, got {ref!r}")

    def validate(self) -> ValidChain:
        return validate(self.name, self.jobs, self.sequences)

    # -- JSON --------------------------------------------------------------------------

    @classmethod
    def from_json(cls, text: str | bytes) -> Chain:
        try:
            data = msgspec.json.decode(text, type=ChainFile)
        except msgspec.ValidationError as exc:
            raise ChainInvalid(f"chain file does not fit the chain format: {exc}") from None
        except msgspec.DecodeError as exc:
            raise ChainInvalid(f"chain file is not valid JSON: {exc}") from None
        except RecursionError:
            raise ChainInvalid("chain file is nested too deeply to be a chain") from None
        chain = cls(data.name, data.args)
        for job in data.jobs:
            chain.job(
                job.type,
                job.payload,
                after=job.after,
                tries=job.tries,
                retry_wait=job.retry_wait,
                key=job.key,
                priority=job.priority,
            )
        for seq in data.sequences:
            chain.sequence(seq.jobs, retries=seq.retries, retry_wait=seq.retry_wait)
        return chain

    def to_json(self) -> bytes:
        data = ChainFile(
            name=self.name,
            args=msgspec.to_builtins(self.args),
            jobs=[
                JobFile(
                    key=j.key,
                    type=j.type,
                    payload=j.payload,
                    after=list(j.after),
                    tries=j.tries,
                    retry_wait=j.retry_wait_s,
                    priority=j.priority,
                )
                for j in self.jobs.values()
            ],
            sequences=[
                SequenceFile(jobs=list(s.jobs), retries=s.retries, retry_wait=s.retry_wait_s)
                for s in self.sequences
            ],
        )
        return msgspec.json.encode(data)


def _next_free(base: str, taken: Mapping[str, object]) -> str:
    n = 2
    while f"{base}-{n}" in taken:
        n += 1
    return f"{base}-{n}"
