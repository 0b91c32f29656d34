"""Named SQL blocks from the packaged .sql files, loaded once, and the two runners of a plan:
a generator of statements that a sync or an async connection runs alike."""

from __future__ import annotations

import functools
import importlib.resources
import re
from collections.abc import Generator
from typing import Any, TypeVar

import psycopg

T = TypeVar("T")
Row = tuple[Any, ...] | None
Statement = tuple[str, dict[str, Any]]
Steps = Generator[Statement, Row, T]


@functools.cache
def load_queries(filename: str) -> dict[str, str]:
    """`-- name: x` starts block x; every statement the store runs lives in such a block."""
    text = (importlib.resources.files("hivejobs.store") / filename).read_text()
    blocks = re.split(r"^-- name: (\w+)\n", text, flags=re.MULTILINE)
    return {name: sql.strip() for name, sql in zip(blocks[1::2], blocks[2::2], strict=True)}


# -- running plans -------------------------------------------------------------------------


def run_plan(conn: psycopg.Connection[Any], plan: Steps[T]) -> T:
    """Run a plan on a sync connection, one round trip per statement."""
    try:
        statement = next(plan)
        while True:
            cur = conn.execute(*statement)
            statement = plan.send(cur.fetchone() if cur.description else None)
    except StopIteration as done:
        result: T = done.value
        return result


async def arun_plan(conn: psycopg.AsyncConnection[Any], plan: Steps[T]) -> T:
    """Run a plan on an async connection, one round trip per statement."""
    try:
        statement = next(plan)
        while True:
            cur = await conn.execute(*statement)
            statement = plan.send(await cur.fetchone() if cur.description else None)
    except StopIteration as done:
        result: T = done.value
        return result
