"""Payload codec without servers: canonical bytes, typed round-trip, size limit, drift."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from hivejobs import JobContext, PayloadInvalid, PayloadTooLarge
from hivejobs.serialization import (
    PayloadCodec,
    decode_any,
    decode_json,
    encode_result,
    payload_type_of,
)


class Resize(msgspec.Struct):
    width: int
    height: int


def untyped(limit: int = 1024) -> PayloadCodec:
    return PayloadCodec("plain", None, limit)


def typed(limit: int = 1024) -> PayloadCodec:
    return PayloadCodec("resize", Resize, limit)


# -- canonical bytes --------------------------------------------------------------------


def test_dict_key_order_does_not_change_the_bytes() -> None:
    """Idempotent ids compare stored bytes: the same payload must encode identically."""
    a = untyped().encode({"b": 1, "a": {"y": [1, 2], "x": None}})
    b = untyped().encode({"a": {"x": None, "y": [1, 2]}, "b": 1})
    assert a == b == b'{"a":{"x":null,"y":[1,2]},"b":1}'


def test_list_order_is_kept() -> None:
    assert untyped().encode([3, 1, 2]) == b"[3,1,2]"


def test_typed_payload_encodes_in_field_order_whatever_the_caller_order() -> None:
    assert typed().encode({"height": 2, "width": 1}) == b'{"width":1,"height":2}'
    assert typed().encode(Resize(width=1, height=2)) == b'{"width":1,"height":2}'


def test_typed_round_trip_drops_unknown_fields() -> None:
    raw = typed().encode({"width": 640, "height": 480, "colour": "red"})
    assert raw == b'{"width":640,"height":480}'
    assert typed().decode(raw) == Resize(width=640, height=480)


def test_struct_built_without_checks_is_validated() -> None:
    """msgspec does not check types in Struct.__init__; the round-trip does."""
    with pytest.raises(PayloadInvalid, match=r"Expected `int`, got `str` - at `\$.width`"):
        typed().encode(Resize(width="wide", height=2))  # type: ignore[arg-type]


def test_schema_error_keeps_msgspec_text_and_names_the_type() -> None:
    with pytest.raises(PayloadInvalid) as info:
        typed().encode({"width": "wide", "height": 2})
    assert str(info.value) == (
        "payload for job type 'resize' is invalid: Expected `int`, got `str` - at `$.width`"
    )
    assert info.value.detail == "Expected `int`, got `str` - at `$.width`"


def test_missing_field_is_invalid() -> None:
    with pytest.raises(PayloadInvalid, match="missing required field `height`"):
        typed().encode({"width": 1})


@pytest.mark.parametrize("value", [object(), {1: "a", "b": 2}, {"nested": object()}])
def test_unserialisable_payload_is_invalid(value: object) -> None:
    with pytest.raises(PayloadInvalid, match="not JSON-serialisable"):
        untyped().encode(value)


# -- size limit -------------------------------------------------------------------------


def test_payload_of_exactly_the_limit_is_accepted() -> None:
    raw = untyped(limit=10).encode("a" * 8)  # two quotes + 8 characters
    assert len(raw) == 10


def test_payload_one_byte_over_the_limit_is_refused() -> None:
    with pytest.raises(PayloadTooLarge) as info:
        untyped(limit=10).encode("a" * 9)
    assert "is 11 bytes, over the limit of 10 bytes" in str(info.value)
    assert "'plain'" in str(info.value)


def test_limit_applies_to_the_canonical_bytes() -> None:
    """Unknown fields are dropped before the size check: only what is stored counts."""
    codec = typed(limit=len(b'{"width":1,"height":2}'))
    assert codec.encode({"width": 1, "height": 2, "padding": "x" * 1000})


# -- decode -----------------------------------------------------------------------------


def test_decode_error_on_schema_drift() -> None:
    """A payload stored under an old schema that no longer fits: PayloadInvalid, no crash."""
    stored = untyped().encode({"width": "640", "height": 480})
    with pytest.raises(PayloadInvalid) as info:
        typed().decode(stored)
    assert "stored payload does not decode" in str(info.value)
    assert "Expected `int`, got `str` - at `$.width`" in str(info.value)


def test_decode_error_on_garbage_bytes() -> None:
    with pytest.raises(PayloadInvalid, match="stored payload does not decode"):
        typed().decode(b"{not json")


def test_untyped_decode_returns_plain_json() -> None:
    assert untyped().decode(b'{"a":[1,2.5,null]}') == {"a": [1, 2.5, None]}


def test_json_text_for_the_cli() -> None:
    def error(detail: str) -> PayloadInvalid:
        return PayloadInvalid("resize", detail)

    value = decode_any('{"height": 2, "width": 1}', error)
    assert typed().encode(value) == b'{"width":1,"height":2}'
    with pytest.raises(PayloadInvalid, match="not valid JSON"):
        decode_any("{width: 1}", error)


def test_json_nested_too_deep_is_invalid_not_a_recursion_error() -> None:
    """JSON nested 2,000 deep is PayloadInvalid, never a RecursionError (CLI and API)."""

    def error(detail: str) -> PayloadInvalid:
        return PayloadInvalid("resize", detail)

    with pytest.raises(PayloadInvalid, match="nested too deeply"):
        decode_any("[" * 2000 + "]" * 2000, error)
    deep: list[object] = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(PayloadInvalid, match="nested too deeply"):
        untyped().encode(deep)
    # A stored payload that deep fails at once as invalid (the pool fails such a job for
    # good), instead of a RecursionError that was retried as an ordinary failure.
    with pytest.raises(PayloadInvalid, match="stored payload does not decode"):
        untyped().decode(b"[" * 100_000 + b"]" * 100_000)


@pytest.mark.parametrize("number", [float("nan"), float("inf"), -float("inf")])
def test_nan_and_infinity_are_refused_not_stored_as_null(number: float) -> None:
    """msgspec would write NaN as null, silently changing the payload: refused."""
    with pytest.raises(PayloadInvalid, match="NaN and infinity"):
        untyped().encode({"a": [1, {"b": number}]})
    assert untyped().encode({"a": None, "b": 1.5}) == b'{"a":null,"b":1.5}'


def test_text_that_is_not_unicode_is_a_payload_error() -> None:
    """A lone surrogate (undecodable bytes from os.listdir or argv) raised UnicodeEncodeError."""
    with pytest.raises(PayloadInvalid, match="not valid Unicode"):
        untyped().encode({"file": b"caf\xe9".decode("utf-8", "surrogateescape")})


def test_results_encode_and_decode() -> None:
    assert encode_result(None) is None
    assert encode_result({"b": 1, "a": 2}) == b'{"a":2,"b":1}'
    assert decode_json(None) is None
    assert decode_json(b'{"a":2}') == {"a": 2}


# -- payload type from the handler's annotation -----------------------------------------


def h_struct(ctx: JobContext, payload: Resize) -> None: ...
def h_any(ctx: JobContext, payload: Any) -> None: ...
def h_object(ctx: JobContext, payload: object) -> None: ...
def h_dict(ctx: JobContext, payload: dict) -> None: ...  # type: ignore[type-arg]
def h_typed_dict(ctx: JobContext, payload: dict[str, int]) -> None: ...
def h_unannotated(ctx, payload):  # type: ignore[no-untyped-def]
    ...
def h_one_param(ctx: JobContext) -> None: ...
def h_unresolvable(ctx: JobContext, payload: Missing) -> None: ...  # type: ignore # noqa: F821


@pytest.mark.parametrize(
    ("handler", "expected"),
    [
        (h_struct, Resize),
        (h_any, None),
        (h_object, None),
        (h_dict, None),
        (h_typed_dict, dict[str, int]),
        (h_unannotated, None),
        (h_one_param, None),
        (h_unresolvable, None),
    ],
)
def test_payload_type_of(handler: Any, expected: object) -> None:
    assert payload_type_of(handler) == expected


def test_typed_dict_values_are_validated() -> None:
    codec = PayloadCodec("counts", dict[str, int], 1024)
    assert codec.encode({"b": 2, "a": 1}) == b'{"a":1,"b":2}'
    with pytest.raises(PayloadInvalid, match=r"Expected `int`, got `str` - at `\$\[\.\.\.\]`"):
        codec.encode({"a": "1"})
