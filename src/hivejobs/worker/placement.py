"""Pool processes of an instance (`@app.job(..., pool="small")`): which job types run in
which process, the checks on `pool=`, and the most Postgres connections an instance opens.

A type without `pool=` runs in processes of its own (`processes=` of them). Types
naming the same pool run as lanes of one process (worker/process.py): each keeps its own runner
threads (`concurrency`), delivery, timeout, limits, retries, fetcher and worker row; they
share the process's Postgres pool, Redis client, heartbeat, memory cap and shutdown. So the
options that belong to the process (`processes`, `max_rss_mb`) must agree across the types
of a pool, checked when the second type is registered. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from hivejobs.errors import InvalidJobType
from hivejobs.jobtypes import NAME_RE, JobType

# Postgres connections, the most each process may hold (every store is a bounded pool).
# A pool process: its own store (SINGLE_STORE for one type: a claim, a completion batch and
# the heartbeat at once; one more per further type up to SHARED_STORE_MAX: the lanes'
# statements are short and wait for a connection, within the store's 5 s timeout), and its
# App's (APP_STORE: handlers' enqueues, a chain's context; opened on first use).
SINGLE_STORE = 3
SHARED_STORE_MAX = 6
APP_STORE = 4
# The coordinator: its store (2), its LISTEN session (1), a compaction's (1). The supervisor:
# 1, while it starts or releases a dead child's claims.
COORDINATOR_CONNECTIONS = 2 + 1 + 1
SUPERVISOR_CONNECTIONS = 1
PROCESS_OPTIONS = ("processes", "max_rss_mb")  # one value per process, so one per pool


@dataclass(frozen=True)
class PoolGroup:
    """The job types that run in one kind of pool process, and how many such processes."""

    name: str  # the pool= name; a type's own name when it has none
    types: tuple[str, ...]
    processes: int
    shared: bool  # declared with pool=: a title "pool NAME" names a pool, not a type

    @property
    def connections(self) -> int:
        return store_size(len(self.types)) + APP_STORE


def store_size(types: int) -> int:
    """Connections of a pool process's own store, for the number of types it runs."""
    return min(SINGLE_STORE + max(0, types - 1), SHARED_STORE_MAX)


def pool_groups(types: Iterable[JobType]) -> list[PoolGroup]:
    """The pool processes an app asks for, in registration order."""
    groups: dict[str, list[JobType]] = {}
    for jt in types:
        groups.setdefault(jt.pool if jt.pool is not None else f"\0{jt.name}", []).append(jt)
    return [
        PoolGroup(
            name=members[0].pool or members[0].name,
            types=tuple(jt.name for jt in members),
            processes=members[0].processes,
            shared=members[0].pool is not None,
        )
        for members in groups.values()
    ]


@dataclass(frozen=True)
class Footprint:
    """What `hivejobs run` starts: processes holding Postgres connections, and the most
    connections they can hold together (`formula` says how it adds up)."""

    processes: int
    postgres_connections_max: int
    formula: str


def footprint(groups: list[PoolGroup], coordinator: bool) -> Footprint:
    """The instance's bound, reported in its banner and start log (tests hold it to it)."""
    parts = [f"{SUPERVISOR_CONNECTIONS} supervisor"]
    total = SUPERVISOR_CONNECTIONS
    processes = 1
    if coordinator:
        parts.append(f"{COORDINATOR_CONNECTIONS} coordinator")
        total += COORDINATOR_CONNECTIONS
        processes += 1
    for g in groups:
        total += g.processes * g.connections
        processes += g.processes
        count = f"{g.processes} x " if g.processes > 1 else ""
        what = f"pool {g.name} ({len(g.types)} types)" if g.shared else g.name
        parts.append(f"{count}{g.connections} {what}")
    return Footprint(processes, total, " + ".join(parts))


def check_pool(
    registered: Mapping[str, JobType],
    name: str,
    pool: str | None,
    processes: int,
    max_rss_mb: float | None,
) -> None:
    """At `@app.job(name, pool=...)`, before anything is registered: a clear InvalidJobType
    for a bad pool name or a process option that differs from the pool's other types."""
    users = sorted(jt.name for jt in registered.values() if jt.pool == name)
    if users:
        raise InvalidJobType(
            f"job type {name!r} has the name of the pool {name!r} of {', '.join(users)}: "
            "rename the pool or the type (`hivejobs restart --pool` must name one of them)"
        )
    if pool is None:
        return
    if not isinstance(pool, str) or not NAME_RE.fullmatch(pool):
        raise InvalidJobType(f"pool name {pool!r} must be 1-64 letters, digits, _.-")
    if pool == name or pool in registered:
        raise InvalidJobType(
            f"pool {pool!r} has the name of job type {pool!r}: choose another pool name"
        )
    peers = [jt for jt in registered.values() if jt.pool == pool]
    if not peers:
        return
    first = peers[0]
    mine = {"processes": processes, "max_rss_mb": max_rss_mb}
    for option in PROCESS_OPTIONS:
        theirs = getattr(first, option)
        if mine[option] != theirs:
            raise InvalidJobType(
                f"job type {name!r} joins pool {pool!r} with {option}={mine[option]!r}, but "
                f"{first.name!r} in that pool has {option}={theirs!r}: the types of a pool "
                f"share its processes, so give each the same {option}"
            )
