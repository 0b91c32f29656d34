"""sequence.py's pure parts: the options refused at declaration and the key of a payload."""

from __future__ import annotations

import pytest

from hivejobs.errors import InvalidJobType, PayloadInvalid
from hivejobs.sequence import SequenceBy, checked_sequence, declared_sequence

BY = SequenceBy(field="account", on_failure="hold")


@pytest.mark.parametrize(
    ("payload", "key"),
    [
        (b'{"account": 42}', "42"),
        (b'{"account": "42"}', '"42"'),  # a string and a number are two keys
        (b'{"account": "acme", "x": 1}', '"acme"'),
        (b'{"account": null}', "null"),
        (b'{"account": {"b": 1, "a": 2}}', '{"b":1,"a":2}'),
    ],
)
def test_the_key_is_the_fields_json_text(payload: bytes, key: str) -> None:
    assert BY.key("t", payload) == key


@pytest.mark.parametrize(
    ("payload", "error"),
    [
        (b'{"acount": 1}', "the payload has no 'account' field (sequence_by='account')"),
        (b"[1, 2]", "sequence_by='account' needs a JSON object payload"),
        (b"null", "sequence_by='account' needs a JSON object payload"),
    ],
)
def test_a_payload_without_the_field_is_refused_naming_it(payload: bytes, error: str) -> None:
    with pytest.raises(PayloadInvalid, match=error.replace("(", r"\(").replace(")", r"\)")):
        BY.key("t", payload)


@pytest.mark.parametrize(
    ("sequence_by", "on_failure", "cron", "expected"),
    [
        (None, None, None, None),
        ("account", None, None, SequenceBy("account", "hold")),
        ("account", "hold", None, SequenceBy("account", "hold")),
        ("account", "continue", None, SequenceBy("account", "continue")),
    ],
)
def test_declared_options(
    sequence_by: str | None, on_failure: str | None, cron: str | None, expected: object
) -> None:
    assert checked_sequence(sequence_by, on_failure, cron) == expected


@pytest.mark.parametrize(
    ("sequence_by", "on_failure", "cron", "error"),
    [
        ("account", "skip", None, "on_failure must be 'hold' or 'continue', not 'skip'"),
        ("account", "", None, "on_failure must be 'hold' or 'continue', not ''"),
        (None, "hold", None, "on_failure needs sequence_by"),
        ("", None, None, "sequence_by must be the name of a payload field, not ''"),
        (3, None, None, "sequence_by must be the name of a payload field, not 3"),
        ("account", None, "* * * * *", "sequence_by cannot go with cron"),
    ],
)
def test_bad_options_are_refused_at_declaration(
    sequence_by: object, on_failure: object, cron: str | None, error: str
) -> None:
    with pytest.raises(InvalidJobType, match=error):
        checked_sequence(sequence_by, on_failure, cron)


def test_a_fleets_declaration_reads_back() -> None:
    assert declared_sequence(None, None) is None
    assert declared_sequence("account", "continue") == SequenceBy("account", "continue")
    assert declared_sequence("account", "hold") == SequenceBy("account", "hold")
