"""Chain validation: the DAG and its sequences, checked before anything is stored.

Pure functions over the builder's data: no Postgres, no Redis, no app (job types and payloads
are checked by chains.api, which knows the registry). Every error is a ChainInvalid that names
the jobs at fault, so a bad chain is refused at the edge (DESIGN invariant 5).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from graphlib import CycleError, TopologicalSorter

from hivejobs.errors import ChainInvalid

# fullmatch, never `$` (which also matches before a trailing newline).
KEY_RE = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
MAX_JOBS = 100_000


@dataclass(frozen=True)
class JobSpec:
    key: str
    type: str
    payload: object
    after: tuple[str, ...]
    tries: int
    retry_wait_s: float
    priority: int | None


@dataclass(frozen=True)
class SequenceSpec:
    jobs: tuple[str, ...]
    retries: int
    retry_wait_s: float


@dataclass(frozen=True)
class ValidChain:
    """A chain that passed every check: jobs in topological order, each job's sequence."""

    order: list[str]
    sequence_of: dict[str, str]  # job key -> its sequence's start key
    starts: dict[str, SequenceSpec]  # start key -> sequence


def check_key(key: object) -> str:
    if not isinstance(key, str) or not KEY_RE.fullmatch(key):
        raise ChainInvalid(f"job key {key!r} must be 1-64 letters, digits, _.-")
    return key


def check_wait(what: str, value: object) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not (value >= 0 and math.isfinite(value))
    ):
        raise ChainInvalid(f"{what} must be a non-negative number of seconds, not {value!r}")
    return float(value)


def check_job_fields(spec: JobSpec) -> None:
    """The checks of one job that need nothing else of its chain: tries and retry_wait."""
    if isinstance(spec.tries, bool) or not isinstance(spec.tries, int) or spec.tries < 1:
        raise ChainInvalid(f"job {spec.key!r}: tries must be an integer >= 1")
    check_wait(f"job {spec.key!r}: retry_wait", spec.retry_wait_s)


def validate(
    name: str, jobs: Mapping[str, JobSpec], sequences: Sequence[SequenceSpec]
) -> ValidChain:
    if not isinstance(name, str) or not 1 <= len(name) <= 200:
        raise ChainInvalid("a chain needs a name of 1-200 characters")
    if "\x00" in name or any(0xD800 <= ord(ch) <= 0xDFFF for ch in name):
        # Postgres text cannot hold NUL nor lone surrogates (undecodable bytes).
        raise ChainInvalid(f"chain name {name!r} contains NUL or bytes that are not UTF-8")
    if not jobs:
        raise ChainInvalid(f"chain {name!r} is empty: add at least one job")
    if len(jobs) > MAX_JOBS:
        raise ChainInvalid(f"chain {name!r} has {len(jobs)} jobs, over the limit of {MAX_JOBS}")
    for spec in jobs.values():
        check_key(spec.key)
        check_job_fields(spec)
        for dep in spec.after:
            if dep not in jobs:
                raise ChainInvalid(
                    f"job {spec.key!r} runs after {dep!r}, which is not a job of this chain"
                )
    order = _topological_order(jobs)
    sequence_of, starts = _check_sequences(jobs, sequences)
    return ValidChain(order, sequence_of, starts)


def _topological_order(jobs: Mapping[str, JobSpec]) -> list[str]:
    """The jobs in running order: ready jobs taken largest key first, each one's newly ready
    successors next (deterministic for a given chain); a cycle is refused by name."""
    sorter = TopologicalSorter({key: spec.after for key, spec in jobs.items()})
    try:
        sorter.prepare()
    except CycleError as exc:
        cycle: list[str] = exc.args[1]  # in running order, the first job repeated at the end
        raise ChainInvalid("chain has a cycle: " + " -> ".join(cycle)) from None
    ready = sorted(sorter.get_ready())
    order: list[str] = []
    while ready:
        key = ready.pop()
        order.append(key)
        sorter.done(key)
        ready.extend(sorter.get_ready())
    return order


def _check_sequences(
    jobs: Mapping[str, JobSpec],
    sequences: Sequence[SequenceSpec],
) -> tuple[dict[str, str], dict[str, SequenceSpec]]:
    sequence_of: dict[str, str] = {}
    starts: dict[str, SequenceSpec] = {}
    for seq in sequences:
        members = set(seq.jobs)
        label = "sequence [" + ", ".join(seq.jobs) + "]"
        if not members:
            raise ChainInvalid("a sequence needs at least one job")
        if isinstance(seq.retries, bool) or not isinstance(seq.retries, int) or seq.retries < 0:
            raise ChainInvalid(f"{label}: retries must be an integer >= 0")
        check_wait(f"{label}: retry_wait", seq.retry_wait_s)
        for key in seq.jobs:
            if key not in jobs:
                raise ChainInvalid(f"{label}: {key!r} is not a job of this chain")
            if key in sequence_of:
                raise ChainInvalid(f"job {key!r} is in two sequences")
        # A start job is where the sequence is entered: no predecessor inside it, or one
        # outside it. Retrying from one start must re-run everything, so exactly one.
        entries = sorted(
            k for k in members if not members & set(jobs[k].after) or set(jobs[k].after) - members
        )
        if len(entries) != 1:
            raise ChainInvalid(
                f"{label} must have exactly one start job (the only one entered from outside "
                f"the sequence), found {len(entries)}: {', '.join(entries) or 'none'}"
            )
        start = entries[0]
        reached = _reachable_inside(jobs, start, members)
        if reached != members:
            raise ChainInvalid(
                f"{label} is not connected: {', '.join(sorted(members - reached))} cannot be "
                f"reached from its start job {start!r} through jobs of the sequence"
            )
        for key in members:
            sequence_of[key] = start
        starts[start] = seq
    return sequence_of, starts


def _reachable_inside(jobs: Mapping[str, JobSpec], start: str, members: set[str]) -> set[str]:
    successors: dict[str, list[str]] = {k: [] for k in members}
    for key in members:
        for dep in jobs[key].after:
            if dep in members:
                successors[dep].append(key)
    reached = {start}
    todo = [start]
    while todo:
        for nxt in successors[todo.pop()]:
            if nxt not in reached:
                reached.add(nxt)
                todo.append(nxt)
    return reached
