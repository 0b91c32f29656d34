"""Validate, encode and decode payloads and results; enforce the size limit.

Payloads are stored as canonical JSON bytes, so that an id re-enqueued with the same
payload compares equal byte for byte. Never logs payloads.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from typing import Any

import msgspec

from hivejobs.errors import PayloadInvalid, PayloadTooLarge

_encoder = msgspec.json.Encoder(order="deterministic")
_any_decoder: msgspec.json.Decoder[Any] = msgspec.json.Decoder()


def payload_type_of(handler: Callable[..., object]) -> type | None:
    """The annotated type of the handler's second parameter, or None for plain JSON."""
    params = list(inspect.signature(handler).parameters.values())
    if len(params) < 2:
        return None
    try:
        hints = typing.get_type_hints(handler)
    except Exception:  # noqa: BLE001 - unresolvable annotations mean untyped
        return None
    hint = hints.get(params[1].name)
    if hint is None or hint is Any or hint is object:
        return None
    if hint in (dict, list) or typing.get_origin(hint) in (dict, list):
        return None if hint in (dict, list) else hint
    return hint  # type: ignore[no-any-return]


class PayloadCodec:
    """One per job type: turns what callers pass into stored bytes and back."""

    def __init__(self, name: str, payload_type: type | None, max_bytes: int) -> None:
        self.name = name
        self.payload_type = payload_type
        self.max_bytes = max_bytes
        self._decoder: msgspec.json.Decoder[Any] = (
            msgspec.json.Decoder(payload_type) if payload_type is not None else _any_decoder
        )

    def encode(self, payload: object) -> bytes:
        """Validate against the type (if any) and return canonical JSON bytes."""
        try:
            raw = _encoder.encode(payload)
        except (TypeError, msgspec.EncodeError, OverflowError) as exc:
            raise PayloadInvalid(self.name, f"not JSON-serialisable: {exc}") from None
        if self.payload_type is not None:
            # Round-trip through the typed decoder: validates Structs built without checks
            # and drops the caller's key order.
            try:
                raw = _encoder.encode(self._decoder.decode(raw))
            except msgspec.ValidationError as exc:
                raise PayloadInvalid(self.name, str(exc)) from None
        if len(raw) > self.max_bytes:
            raise PayloadTooLarge(self.name, len(raw), self.max_bytes)
        return raw

    def encode_json_text(self, text: str) -> bytes:
        """For the CLI: the payload arrives as JSON text."""
        try:
            value = _any_decoder.decode(text)
        except msgspec.DecodeError as exc:
            raise PayloadInvalid(self.name, f"not valid JSON: {exc}") from None
        return self.encode(value)

    def decode(self, raw: bytes) -> object:
        """Decode for the handler; a stored payload that no longer fits raises PayloadInvalid."""
        try:
            return self._decoder.decode(raw)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            raise PayloadInvalid(self.name, f"stored payload does not decode: {exc}") from None


def encode_result(value: object) -> bytes | None:
    if value is None:
        return None
    return _encoder.encode(value)


def decode_json(raw: bytes | None) -> object:
    if raw is None:
        return None
    return _any_decoder.decode(raw)


def storable_text(text: str, max_bytes: int) -> str:
    """Text from user code made fit for a Postgres text column, at most `max_bytes` of UTF-8.

    Handlers raise what the OS gave them: ``os.listdir``, ``sys.argv`` and ``os.environ``
    carry undecodable bytes as lone surrogates, which UTF-8 cannot encode; such a byte is
    kept visible as ``\\xe9``. NUL (which Postgres text cannot hold) becomes ``\\x00``. A text
    over the limit keeps its head and its tail (where a traceback puts the exception) with a
    note of what was cut between them.
    """
    raw = _utf8(text.replace("\x00", "\\x00"))
    if len(raw) <= max_bytes:
        return raw.decode()
    note = (
        f"\n[... truncated: {{cut}} of {len(raw)} bytes cut (max_result_bytes is {max_bytes})"
        " ...]\n"
    )
    cut_room = len(str(len(raw)))
    keep = max(0, max_bytes - len(note.encode()) - cut_room)
    head = raw[: keep - keep // 2].decode(errors="ignore")
    tail = raw[len(raw) - keep // 2 :].decode(errors="ignore")
    cut = len(raw) - len(head.encode()) - len(tail.encode())
    return head + note.format(cut=cut) + tail


def _utf8(text: str) -> bytes:
    try:
        return text.encode()
    except UnicodeEncodeError:
        pass
    try:
        # Bytes smuggled in by the surrogateescape handler: show the original byte.
        return text.encode(errors="surrogateescape").decode(errors="backslashreplace").encode()
    except UnicodeEncodeError:
        return text.encode(errors="backslashreplace")  # other lone surrogates: \udxxx
