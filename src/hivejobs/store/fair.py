"""Fair-dispatch statements (fair.sql): the key of each job of a `fair_by` type.

Part of store/: decides nothing. The broker's sorter (broker/fair.py) asks here which key and
priority each popped id has, because Postgres holds the payload and Redis only the id.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from hivejobs.store.sql import load_queries

if TYPE_CHECKING:
    from hivejobs.store import Store

QUERIES = load_queries("fair.sql")


class KeyCount(msgspec.Struct, frozen=True, kw_only=True):
    """One key of a fair type and its live jobs."""

    key: str
    queued: int
    running: int
    scheduled: int


class FairStore:
    """A fair type's keys, over the Store's connection pool."""

    def __init__(self, store: Store, name: str, field: str) -> None:
        self.store = store
        self.name = name
        self.field = field

    def keys_of(self, ids: list[str]) -> list[tuple[str, int, str]]:
        """(id, priority, key) of the ids still queued for this type, in the order given
        (the inbox's order is each key's order)."""
        params = {"ids": ids, "name": self.name, "field": self.field}
        with self.store.connection() as conn:
            rows = conn.execute(QUERIES["fair_keys"], params).fetchall()
        found = {str(r[0]): (int(r[1]), str(r[2])) for r in rows}
        # dict.fromkeys: an id pushed twice is placed once, at its first place.
        return [(i, *found[i]) for i in dict.fromkeys(ids) if i in found]

    def key_counts(self, limit: int = 100) -> list[KeyCount]:
        params = {"name": self.name, "field": self.field, "limit": limit}
        with self.store.connection() as conn:
            rows = conn.execute(QUERIES["fair_key_counts"], params).fetchall()
        return [KeyCount(key=r[0], queued=r[1], running=r[2], scheduled=r[3]) for r in rows]
