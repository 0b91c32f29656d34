"""Fan-out from a running chain job: jobs it adds to its own chain (ctx.chain.add).

    more = ctx.chain.grow()
    parts = [more.job("resize", {"file": f}, name=f"file-{i}") for i, f in enumerate(files)]
    more.job("report", {}, name="join", after=parts, before=["publish"])
    ctx.chain.add(more)

An added job's key is '<adding key>.<name>' (the name given, or the job's position among the
unnamed jobs this try adds), so a try that runs again after a kill adds the same keys: the
ones its earlier try stored are kept as they are and only the others are added. Added jobs
all run below the adding job: `after=` names added jobs, the adding job, or jobs below it
(none given: the adding job); `before=` makes a pending job below it also wait for the added
one. They join no sequence.

Two halves: `Growth` builds data and checks each job alone (type, payload, tries), before
any statement; `plan_growth` checks the DAG (descendants, cycles, keys taken) against the
chain as stored, inside the transaction that writes it, so nothing of a refused growth is
stored. Neither touches Postgres itself.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from graphlib import CycleError, TopologicalSorter
from typing import Any

from hivejobs.chains.checks import JobTypeLookup, job_row
from hivejobs.chains.validate import KEY_RE, MAX_JOBS, JobSpec, check_job_fields
from hivejobs.errors import ChainInvalid
from hivejobs.store.chains import GrowthSnapshot, GrowthWrite

# An added key nests its adder's key: a fan-out from an added job still fits (fullmatch).
ADDED_KEY_RE = re.compile(r"[A-Za-z0-9_.\-]{1,200}")


class Growth:
    """Jobs a running chain job adds, built with `job()` and stored by `ctx.chain.add`.

    Owns the jobs built so far (`jobs`, by full key, in order) and each one's `before` keys.
    Positions for unnamed jobs come from `position`, the try's counter: numbered in the
    order of `job()` calls across all of the try's growths, the same on every try."""

    def __init__(self, adder: str, position: Callable[[], int]) -> None:
        self.adder = adder
        self._position = position
        self.jobs: dict[str, JobSpec] = {}
        self.before: dict[str, tuple[str, ...]] = {}

    def job(
        self,
        type: str,  # the job type
        payload: object = None,
        *,
        name: str | None = None,
        after: Iterable[str] = (),
        before: Iterable[str] = (),
        tries: int = 1,
        retry_wait: float = 0.0,
        priority: int | None = None,
    ) -> str:
        """Add a job of a registered type; returns its key ('<adding key>.<name>') for
        `after=` of other jobs. `after`: added jobs, the adding job or jobs below it (default:
        the adding job). `before`: pending jobs below the adding job that must also wait for
        this one. Give `name` when the order of calls may change between tries."""
        if name is None:
            name = str(self._position())
        if not isinstance(name, str) or not KEY_RE.fullmatch(name):
            raise ChainInvalid(f"added job name {name!r} must be 1-64 letters, digits, _.-")
        key = f"{self.adder}.{name}"
        if not ADDED_KEY_RE.fullmatch(key):
            raise ChainInvalid(
                f"added job key {key!r} is over 200 characters: shorten the names of the "
                "jobs that add jobs"
            )
        if key in self.jobs:
            raise ChainInvalid(f"job {self.adder!r} adds two jobs named {name!r}")
        spec = JobSpec(
            key=key,
            type=type,
            payload=payload,
            after=_keys(after, key, "after"),
            tries=tries,
            retry_wait_s=retry_wait,
            priority=priority,
        )
        check_job_fields(spec)
        self.jobs[key] = spec
        self.before[key] = _keys(before, key, "before")
        return key

    def rows(self, job_type: JobTypeLookup) -> list[dict[str, Any]]:
        """Every job checked against the registry (type, payload, tries, priority), as the
        rows that store it: run before the transaction, so a bad job costs no statement."""
        if not self.jobs:
            raise ChainInvalid(f"job {self.adder!r} adds no jobs: call job() first")
        return [job_row(spec, None, job_type) for spec in self.jobs.values()]


def _keys(refs: Iterable[str], key: str, field: str) -> tuple[str, ...]:
    if isinstance(refs, str):
        raise ChainInvalid(f"added job {key!r}: {field} takes a list of job keys, not a string")
    out = tuple(dict.fromkeys(refs))  # a key named twice is one edge
    for ref in out:
        if not isinstance(ref, str):
            raise ChainInvalid(f"added job {key!r}: {field} takes job keys, not {ref!r}")
    return out


def plan_growth(
    snap: GrowthSnapshot, rows: list[dict[str, Any]], before: dict[str, tuple[str, ...]]
) -> GrowthWrite:
    """What to write for `rows` (Growth.rows) added by `snap.adder`, checked against the
    chain as stored; ChainInvalid (nothing written) names the first job at fault."""
    adder, jobs = snap.adder, snap.jobs
    below = _descendants(snap, adder)
    growth_keys = {row["key"] for row in rows}
    new: list[dict[str, Any]] = []
    for row in rows:
        have = jobs.get(row["key"])
        if have is None:
            new.append(row)
        elif have.added_by != adder:
            raise ChainInvalid(
                f"added job {row['key']!r}: the chain already has a job of that key, not "
                f"added by {adder!r}"
            )
        # else: added by an earlier try of the adder: kept as it is (the first add wins).
    waits: dict[str, list[str]] = {}
    for row in new:
        key = row["key"]
        for dep in row["after"]:
            if dep not in growth_keys and dep != adder and dep not in below:
                raise ChainInvalid(f"added job {key!r}: after {_not_below(snap, dep, below)}")
        row["after"] = row["after"] or [adder]
        for target in before[key]:
            if target == adder:
                raise ChainInvalid(
                    f"added job {key!r}: before {adder!r}, the job adding it, which already runs"
                )
            if target not in below:
                raise ChainInvalid(f"added job {key!r}: before {_not_below(snap, target, below)}")
            stored = jobs[target]
            if stored.state != "pending":
                raise ChainInvalid(
                    f"added job {key!r}: before {target!r}, which has already started "
                    f"({stored.state}): only a pending job can wait for more"
                )
            if stored.seq is not None:
                raise ChainInvalid(
                    f"added job {key!r}: before {target!r}, which is in a sequence: an added "
                    "job would become a second way into it"
                )
            waits.setdefault(target, []).append(key)
    if len(jobs) + len(new) > MAX_JOBS:
        raise ChainInvalid(
            f"job {adder!r} adds {len(new)} jobs to a chain of {len(jobs)}: over the limit "
            f"of {MAX_JOBS} jobs"
        )
    _check_acyclic(snap, below, new, waits)
    return GrowthWrite(rows=new, before=waits)


def _descendants(snap: GrowthSnapshot, key: str) -> set[str]:
    """Every stored job that runs after `key`, directly or not."""
    successors: dict[str, list[str]] = {}
    for job in snap.jobs.values():
        for dep in job.after_keys:
            successors.setdefault(dep, []).append(job.key)
    found: set[str] = set()
    todo = [key]
    while todo:
        for nxt in successors.get(todo.pop(), ()):
            if nxt not in found:
                found.add(nxt)
                todo.append(nxt)
    return found


def _not_below(snap: GrowthSnapshot, key: str, below: set[str]) -> str:
    if key in snap.jobs:
        return (
            f"{key!r}, which is neither {snap.adder!r} nor a job below it: a job adds jobs "
            "only below itself"
        )
    return f"{key!r}, which is not a job of this chain nor added with it"


def _check_acyclic(
    snap: GrowthSnapshot,
    below: set[str],
    new: list[dict[str, Any]],
    waits: dict[str, list[str]],
) -> None:
    """A cycle can only pass through added jobs and the jobs below the adder: nothing else
    runs after an added job. So the sorter sees just those."""
    scope = below | {snap.adder} | {row["key"] for row in new}
    graph: dict[str, set[str]] = {}
    for key in below:
        graph[key] = {dep for dep in snap.jobs[key].after_keys if dep in scope}
        graph[key].update(waits.get(key, ()))
    for row in new:
        graph[row["key"]] = set(row["after"])
    try:
        TopologicalSorter(graph).prepare()
    except CycleError as exc:
        cycle: list[str] = exc.args[1]
        raise ChainInvalid("the added jobs make a cycle: " + " -> ".join(cycle)) from None
