"""Postgres LISTEN/NOTIFY: the channels, the dispatch payload (built and parsed here alone)
and the coordinator's listening session.

Two channels. `hivejobs_dispatch` carries jobs enqueued inside a caller's transaction: NOTIFY
is delivered only on commit, so the coordinator pushes their ids once (and only if) the
caller commits. Its payload is "type<TAB>priority<TAB>id..." (job ids never hold a tab:
control characters are refused at the edge). `hivejobs_chain` wakes the traverser: a comma
separated list of chain ids, or "" for "look for chain work" (wake_traverser in
chain_queries.sql). Statements in notify.sql. Decides nothing about what a wake-up leads to.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import msgspec
import psycopg

from hivejobs.records.dispatch import Push
from hivejobs.records.jobs import JOB_TYPE_NAME_RE, PRIORITIES
from hivejobs.store.db import connect
from hivejobs.store.sql import load_queries

NOTIFY = load_queries("notify.sql")
CHAIN_CHANNEL = "hivejobs_chain"
MAX_NOTIFY_BYTES = 7_900  # Postgres refuses a NOTIFY payload of 8,000 bytes or more


def dispatch_payloads(pushes: Sequence[Push] | Sequence[tuple[str, str, int]]) -> list[str]:
    """Group ids by (type, priority) into payloads under Postgres' NOTIFY size limit."""
    out: list[str] = []
    groups: dict[tuple[str, int], list[str]] = {}
    for job_id, name, priority in pushes:
        groups.setdefault((name, priority), []).append(job_id)
    for (name, priority), ids in groups.items():
        head = f"{name}\t{priority}"
        parts = [head]
        size = len(head.encode())
        for job_id in ids:
            grow = len(job_id.encode()) + 1
            if size + grow > MAX_NOTIFY_BYTES and len(parts) > 1:
                out.append("\t".join(parts))
                parts, size = [head], len(head.encode())
            parts.append(job_id)
            size += grow
        out.append("\t".join(parts))
    return out


def parse_dispatch(payload: str) -> list[Push]:
    """The pushes one dispatch payload carries; ValueError when it is not one of ours (any
    role may NOTIFY): a type name we could register, a priority some pool pops, ids."""
    parts = payload.split("\t")
    name, priority, ids = parts[0], parts[1] if len(parts) > 1 else "", parts[2:]
    if not JOB_TYPE_NAME_RE.fullmatch(name) or not priority.isdecimal():
        raise ValueError("dispatch payload without a job type and a priority")
    if int(priority) not in PRIORITIES or not ids or not all(ids):
        raise ValueError("dispatch payload with a priority out of range or no ids")
    return [Push(job_id, name, int(priority)) for job_id in ids]


class Malformed(msgspec.Struct, frozen=True):
    """A dispatch notification that is not one of ours (anyone who can connect may NOTIFY)."""

    payload: str
    pid: int


class Heard(msgspec.Struct, kw_only=True):
    """What a wait heard, sorted: ids to push, chains to traverse, a chain search asked for,
    and notifications that were not ours (only those are lost: the rest are dispatched)."""

    pushes: list[Push] = msgspec.field(default_factory=list)
    chains: set[str] = msgspec.field(default_factory=set)
    search_chains: bool = False
    malformed: list[Malformed] = msgspec.field(default_factory=list)


def sort_notes(notes: Iterable[psycopg.Notify]) -> Heard:
    """Sort notifications into dispatch pushes and chain wake-ups."""
    heard = Heard()
    for note in notes:
        if note.channel == CHAIN_CHANNEL:
            if note.payload:
                heard.chains.update(note.payload.split(","))
            else:
                heard.search_chains = True
            continue
        try:
            heard.pushes.extend(parse_dispatch(note.payload))
        except ValueError:
            heard.malformed.append(Malformed(note.payload, note.pid))
    return heard


class Listener:
    """Owns the coordinator's LISTEN session: one direct connection (never through a
    transaction-mode pooler, where LISTEN hears nothing), opened on the first wait and
    closed on any error, so that the next wait opens a fresh one."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._conn: psycopg.Connection[Any] | None = None

    def wait(self, timeout_s: float) -> Heard:
        """Wait up to `timeout_s` for notifications; every one already here comes back.

        Raises psycopg.Error or ConnectionFailed (the session is closed first)."""
        try:
            if self._conn is None:
                self._conn = connect(self.url)
                self._conn.execute(NOTIFY["listen_dispatch"])
                self._conn.execute(NOTIFY["listen_chain"])
            # stop_after=1 returns with the first packet of notifications, all of it (never
            # leave a notifies() generator early: the rest of its packet would be lost).
            notes = list(self._conn.notifies(timeout=timeout_s, stop_after=1))
            if notes:
                # One pass serves every notification already here, so collect those too.
                notes += self._conn.notifies(timeout=0.0, stop_after=1000)
        except BaseException:
            self.close()
            raise
        return sort_notes(notes)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._conn = None
