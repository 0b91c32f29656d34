"""Named SQL blocks from the packaged .sql files, loaded once."""

from __future__ import annotations

import functools
import importlib.resources
import re


@functools.cache
def load_queries(filename: str) -> dict[str, str]:
    """`-- name: x` starts block x; every statement the store runs lives in such a block."""
    text = (importlib.resources.files("hivejobs.store") / filename).read_text()
    blocks = re.split(r"^-- name: (\w+)\n", text, flags=re.MULTILINE)
    return {name: sql.strip() for name, sql in zip(blocks[1::2], blocks[2::2], strict=True)}
