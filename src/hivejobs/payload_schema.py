"""Payload JSON Schemas: the worker declares what each handler accepts, so that an enqueuer
without the app's code (`hivejobs enqueue` with no --app, another service's App) refuses a
payload the worker would reject, before anything is written (DESIGN invariant 5).

`hivejobs run` declares msgspec.json.schema of each handler's payload type in Postgres at
start; `App.job_type` builds a SchemaCodec from it for a type it only knows from Postgres.
A type that no worker of this version declared, or whose payload type has no JSON Schema,
cannot be checked: enqueueing it without the app is refused and says so. Never logs payloads.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import msgspec

from hivejobs.errors import PayloadInvalid, PayloadTooLarge, PayloadUncheckable
from hivejobs.serialization import TOO_DEEP, PayloadCodec, encode_json
from hivejobs.store.payload_schemas import PayloadSchemaStore

if TYPE_CHECKING:
    from hivejobs.jobtypes import JobType
    from hivejobs.store import Store

REFRESH_S = 5.0  # as the declared job types: a redeployed worker's schema is seen this late
_MAX_DETAIL = 200  # a validator's message quotes the value; a payload may be a megabyte


def schema_of(jt: JobType) -> object | None:
    """The JSON Schema of a handler's payload: {} (any JSON) for an untyped one, None for a
    type msgspec cannot describe (then only an enqueuer with the app can check it)."""
    payload_type = jt.codec.payload_type
    if payload_type is None:
        return {}
    try:
        return msgspec.json.schema(payload_type)
    except (TypeError, ValueError):
        return None


def declare_schemas(store: Store, types: Mapping[str, JobType]) -> None:
    """At worker start, beside the job type rows: what each of its handlers accepts."""
    PayloadSchemaStore(store).declare({name: schema_of(jt) for name, jt in types.items()})


class SchemaCodec(PayloadCodec):
    """Checks a payload against a declared JSON Schema, as the worker's typed decoder would,
    and stores the same canonical JSON (deterministic key order) an untyped codec does."""

    def __init__(self, name: str, schema: object, max_bytes: int) -> None:
        super().__init__(name, None, max_bytes)
        self._validator = _validator(schema)

    def encode(self, payload: object) -> bytes:
        raw = encode_json(payload, lambda detail: PayloadInvalid(self.name, detail))
        if len(raw) > self.max_bytes:
            raise PayloadTooLarge(self.name, len(raw), self.max_bytes)
        try:
            error = _first_error(self._validator, msgspec.json.decode(raw))
        except RecursionError:
            raise PayloadInvalid(self.name, TOO_DEEP) from None
        if error is not None:
            raise PayloadInvalid(self.name, error)
        return raw


class UncheckableCodec(PayloadCodec):
    """A remote type whose schema is unknown: every enqueue is refused, saying why. Other
    uses of the type (a status callback, a listing) need no payload and still work."""

    def __init__(self, name: str, why: str, max_bytes: int) -> None:
        super().__init__(name, None, max_bytes)
        self.why = why

    def encode(self, payload: object) -> bytes:
        raise PayloadUncheckable(self.name, self.why)


class RemoteSchemas:
    """Per App: the codec of each remote type, read from Postgres and kept REFRESH_S (the
    read happens where the type is looked up: in a thread for async enqueues, inside the
    Postgres error handling for sync ones). `_lock` guards `_codecs`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._codecs: dict[str, tuple[float, PayloadCodec]] = {}

    def codec(self, store: Store, name: str, max_bytes: int) -> PayloadCodec:
        with self._lock:
            cached = self._codecs.get(name)
        if cached is not None and time.monotonic() - cached[0] < REFRESH_S:
            return cached[1]
        declared = PayloadSchemaStore(store).get(name)
        codec: PayloadCodec
        if declared is None:
            why = "no worker declared its payload schema (start or restart one)"
            codec = UncheckableCodec(name, why, max_bytes)
        elif declared.schema is None:
            codec = UncheckableCodec(name, "its payload type has no JSON Schema", max_bytes)
        else:
            codec = SchemaCodec(name, declared.schema, max_bytes)
        with self._lock:
            self._codecs[name] = (time.monotonic(), codec)
        return codec


def _validator(schema: object) -> Any:
    """A Draft 2020-12 validator (msgspec's dialect) whose `integer` is msgspec's: 1.0 is a
    float there, and the worker's decoder would refuse it."""
    import jsonschema

    base = jsonschema.Draft202012Validator
    checker = base.TYPE_CHECKER.redefine(
        "integer", lambda _, value: isinstance(value, int) and not isinstance(value, bool)
    )
    strict = jsonschema.validators.extend(base, type_checker=checker)
    return strict(schema, format_checker=base.FORMAT_CHECKER)


def _first_error(validator: Any, value: object) -> str | None:
    """msgspec's shape ("Expected `integer`, got `string` - at `$.width`"), with no value in
    it for type errors and other messages cut short."""
    import jsonschema

    error = jsonschema.exceptions.best_match(validator.iter_errors(value))
    if error is None:
        return None
    where = "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
    if error.validator == "type":
        expected = error.validator_value
        wanted = " or ".join(expected) if isinstance(expected, list) else expected
        message = f"Expected `{wanted}`, got `{_json_type(error.instance)}`"
    else:
        message = error.message
        if len(message) > _MAX_DETAIL:
            message = message[: _MAX_DETAIL - 3] + "..."
    return f"{message} - at `{where}`"


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"
