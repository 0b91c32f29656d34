"""Making foreign text storable, reading dispatch notifications, classifying write errors."""

from __future__ import annotations

import psycopg
import pytest

from hivejobs.serialization import storable_text
from hivejobs.store import is_data_error
from hivejobs.store.notify import parse_dispatch


def test_surrogates_and_nul_become_visible_escapes() -> None:
    name = b"caf\xe9".decode("utf-8", "surrogateescape")  # what os.listdir returns
    assert storable_text("file " + name, 1024) == "file caf\\xe9"
    assert storable_text("a\ud800b\x00c", 1024) == "a\\ud800b\\x00c"
    assert storable_text("plain é", 1024) == "plain é"


@pytest.mark.parametrize("limit", [1024, 1025, 4096, 65536])
def test_long_text_keeps_head_and_tail_within_the_limit(limit: int) -> None:
    text = "HEAD" + "é" * 100_000 + "TAIL"
    stored = storable_text(text, limit)
    assert len(stored.encode()) <= limit
    assert stored.startswith("HEADé") and stored.endswith("éTAIL")
    assert f"of {len(text.encode())} bytes cut (max_result_bytes is {limit})" in stored


def test_dispatch_payloads_are_parsed_or_refused() -> None:
    assert parse_dispatch("resize\t3\tjob-1") == [("job-1", "resize", 3)]
    for bad in ("", "not a dispatch", "resize\t99\tx", "resize\t-1\tx", "resize\tx\tid", "\t0\tx"):
        with pytest.raises(ValueError):
            parse_dispatch(bad)


def test_data_errors_are_told_from_connection_errors() -> None:
    assert is_data_error(psycopg.errors.UniqueViolation())
    assert is_data_error(psycopg.errors.CharacterNotInRepertoire())
    assert is_data_error(psycopg.errors.ProgramLimitExceeded())
    assert is_data_error(UnicodeEncodeError("utf-8", "\udce9", 0, 1, "surrogates not allowed"))
    assert not is_data_error(psycopg.OperationalError("connection lost"))
    assert not is_data_error(psycopg.errors.AdminShutdown())
    assert not is_data_error(psycopg.errors.ReadOnlySqlTransaction())
    assert not is_data_error(psycopg.errors.SerializationFailure())
