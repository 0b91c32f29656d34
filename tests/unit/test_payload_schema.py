"""A declared schema gives the verdict the worker's own decoder gives (no servers): the
payloads `hivejobs enqueue` accepts without the app are those the handler can decode."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
import pytest

from hivejobs import App, JobContext
from hivejobs.errors import PayloadInvalid, PayloadTooLarge
from hivejobs.payload_schema import SchemaCodec, schema_of


class Size(msgspec.Struct):
    w: Annotated[int, msgspec.Meta(ge=1)]
    h: int | None = None


class Order(msgspec.Struct):
    id: str
    sizes: list[Size]
    tags: dict[str, float] = {}
    kind: Literal["a", "b"] = "a"


app = App()


@app.job("order")
def order(ctx: JobContext, payload: Order) -> None: ...


PAYLOADS = [
    {"id": "x", "sizes": []},
    {"id": "x", "sizes": [{"w": 1}, {"w": 2, "h": None}, {"w": 3, "h": 4}]},
    {"id": "x", "sizes": [{"w": 0}]},
    {"id": "x", "sizes": [{"w": 1.5}]},
    {"id": "x", "sizes": [{"w": True}]},
    {"id": "x", "sizes": [{"h": 2}]},
    {"id": "x", "sizes": [], "tags": {"a": 1, "b": 2.5}},
    {"id": "x", "sizes": [], "tags": {"a": "1"}},
    {"id": "x", "sizes": [], "kind": "c"},
    {"id": 5, "sizes": []},
    {"id": "x", "sizes": [], "unknown": 1},  # msgspec ignores unknown fields by default
    {"sizes": []},
    [],
    None,
]


@pytest.mark.parametrize("payload", PAYLOADS, ids=repr)
def test_the_declared_schema_agrees_with_the_typed_decoder(payload: object) -> None:
    typed = app.types["order"].codec
    remote = SchemaCodec("order", schema_of(app.types["order"]), typed.max_bytes)
    try:
        typed.encode(payload)
        worker_accepts = True
    except PayloadInvalid:
        worker_accepts = False
    try:
        stored = remote.encode(payload)
    except PayloadInvalid as exc:
        assert not worker_accepts, str(exc)
        assert "- at `$" in str(exc)  # where, as msgspec says it
        return
    assert worker_accepts, payload
    typed.decode(stored)  # what the CLI stores, the worker decodes


def test_the_size_limit_holds_without_the_app() -> None:
    codec = SchemaCodec("note", {}, 64)
    with pytest.raises(PayloadTooLarge):
        codec.encode({"text": "x" * 100})


def test_a_type_error_does_not_quote_the_payload() -> None:
    codec = SchemaCodec("order", schema_of(app.types["order"]), 1 << 20)
    with pytest.raises(PayloadInvalid) as caught:
        codec.encode({"id": "secret-" * 50, "sizes": "card 4111 1111"})
    assert "4111" not in str(caught.value) and "Expected `array`, got `string`" in str(caught.value)


def test_a_payload_too_deep_to_check_is_refused_in_one_line() -> None:
    """A recursive schema walks as deep as the payload: past the interpreter's limit it is
    PayloadInvalid, not a RecursionError traceback."""
    codec = SchemaCodec("tree", {"type": "array", "items": {"$ref": "#"}}, 1 << 20)
    deep: list[object] = []
    for _ in range(900):
        deep = [deep]
    with pytest.raises(PayloadInvalid, match="nested too deeply"):
        codec.encode(deep)


@app.job("loose")
def loose(ctx: JobContext, payload: dict[str, object] | list[object]) -> None: ...


@pytest.mark.parametrize(
    "payload", [{"a": 1, "b": [None, "x"]}, {}, [1, {"k": "v"}], "text", 3, None]
)
def test_object_in_a_payload_type_accepts_what_the_decoder_accepts(payload: object) -> None:
    """`object` decodes any JSON value in msgspec; its schema says the same (not 'none')."""
    jt = app.types["loose"]
    schema = schema_of(jt)
    assert schema is not None
    codec = SchemaCodec("loose", schema, 1 << 20)
    try:
        msgspec.json.decode(msgspec.json.encode(payload), type=jt.codec.payload_type)
    except msgspec.ValidationError:
        with pytest.raises(PayloadInvalid):
            codec.encode(payload)
    else:
        codec.encode(payload)
