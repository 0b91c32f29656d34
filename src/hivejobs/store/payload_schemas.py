"""Payload schema statements (payload_schema_queries.sql): declare and read each job type's
payload JSON Schema.

Part of store/: decides nothing. The worker declares what its handlers accept; an enqueuer
without the app reads it to check a payload before anything is written (DESIGN invariant 5).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import msgspec
from psycopg.types.json import Jsonb

from hivejobs.store.sql import load_queries

if TYPE_CHECKING:
    from hivejobs.store import Store

QUERIES = load_queries("payload_schema_queries.sql")


class DeclaredSchema(msgspec.Struct, frozen=True):
    """A type's row: `schema` None means its payload type has no JSON Schema."""

    schema: object


class PayloadSchemaStore:
    """The payload schema table, over the Store's connection pool."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def declare(self, schemas: Mapping[str, object]) -> None:
        """One row per job type, in one transaction (None: no schema for that type)."""
        with self.store.connection() as conn, conn.transaction():
            for name, schema in schemas.items():
                conn.execute(
                    QUERIES["declare_payload_schema"],
                    {"job_type": name, "schema": None if schema is None else Jsonb(schema)},
                )

    def get(self, name: str) -> DeclaredSchema | None:
        """The declared schema, or None when no worker of this version declared the type."""
        with self.store.connection() as conn:
            row = conn.execute(QUERIES["payload_schema"], {"job_type": name}).fetchone()
        return None if row is None else DeclaredSchema(row[0])
