"""Validate, encode and decode payloads and results; enforce the size limit.

Payloads are stored as canonical JSON bytes, so that an id re-enqueued with the same
payload compares equal byte for byte. Never logs payloads.
"""

from __future__ import annotations

import inspect
import math
import typing
from collections.abc import Callable
from typing import Any

import msgspec

from hivejobs.errors import PayloadInvalid, PayloadTooLarge
from hivejobs.urls import known_secrets, scrub_known

_encoder = msgspec.json.Encoder(order="deterministic")
TOO_DEEP = "nested too deeply (JSON deeper than a few hundred levels is refused)"
_any_decoder: msgspec.json.Decoder[Any] = msgspec.json.Decoder()


def payload_type_of(handler: Callable[..., object]) -> type | None:
    """The annotated type of the handler's second parameter, or None for plain JSON."""
    params = list(inspect.signature(handler).parameters.values())
    if len(params) < 2:
        return None
    try:
        hints = typing.get_type_hints(handler)
    except Exception:  # unresolvable annotations mean untyped
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
        raw = encode_json(payload, lambda detail: PayloadInvalid(self.name, detail))
        if self.payload_type is not None:
            # Round-trip through the typed decoder: validates Structs built without checks
            # and drops the caller's key order.
            try:
                raw = _encoder.encode(self._decoder.decode(raw))
            except msgspec.ValidationError as exc:
                raise PayloadInvalid(self.name, str(exc)) from None
            except RecursionError:
                raise PayloadInvalid(self.name, TOO_DEEP) from None
        if len(raw) > self.max_bytes:
            raise PayloadTooLarge(self.name, len(raw), self.max_bytes)
        return raw

    def decode(self, raw: bytes) -> object:
        """Decode for the handler; a stored payload that no longer fits raises PayloadInvalid."""
        try:
            return self._decoder.decode(raw)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            raise PayloadInvalid(self.name, f"stored payload does not decode: {exc}") from None
        except RecursionError:
            # Will not decode on any retry either: invalid, failed at once by the pool.
            raise PayloadInvalid(self.name, f"stored payload does not decode: {TOO_DEEP}") from None


def encode_json(value: object, error: Callable[[str], Exception]) -> bytes:
    """Canonical JSON bytes, or error(detail) for what JSON cannot carry faithfully: objects
    it does not know, text that is not Unicode (lone surrogates, e.g. undecodable file names),
    nesting deeper than the interpreter can walk, and NaN or infinities (msgspec writes them
    as null, which would silently change the data)."""
    try:
        raw = _encoder.encode(value)
    except (TypeError, msgspec.EncodeError, OverflowError) as exc:
        raise error(f"not JSON-serialisable: {exc}") from None
    except UnicodeEncodeError:
        raise error("text is not valid Unicode (a lone surrogate: undecodable bytes)") from None
    except RecursionError:
        raise error(TOO_DEEP) from None
    if b"null" in raw and _has_non_finite(value):
        raise error("NaN and infinity are not JSON numbers")
    return raw


def _has_non_finite(value: object) -> bool:
    """Only called when the encoded text holds a null: iterative, so depth is no issue."""
    stack = [msgspec.to_builtins(value)]
    while stack:
        item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return True
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return False


def decode_any(text: str | bytes, error: Callable[[str], Exception]) -> object:
    """JSON text from a user (CLI argument, file) to a value, or error(detail)."""
    try:
        return _any_decoder.decode(text)
    except msgspec.DecodeError as exc:
        raise error(f"not valid JSON: {exc}") from None
    except RecursionError:
        raise error(TOO_DEEP) from None


def encode_result(value: object) -> bytes | None:
    """The stored form of a handler's return value, without the process's passwords."""
    if value is None:
        return None
    return scrub_result(_encoder.encode(value))


def scrub_result(raw: bytes) -> bytes:
    """A result is shown to read tokens, on the dashboard and to a chain's next jobs: a
    password the log sink hides (a DSN in a returned dict) must not be kept there in clear.
    Strings are scrubbed one by one (keys too), so the result stays JSON whatever the
    password's characters; the common case (no password in it) costs one search each."""
    secrets = known_secrets()
    if not secrets:
        return raw
    text = raw.decode()
    if not any(s in text or _encoder.encode(s)[1:-1].decode() in text for s in secrets):
        return raw
    return _encoder.encode(_scrubbed(_any_decoder.decode(raw)))


def _scrubbed(value: object) -> object:
    if isinstance(value, str):
        return scrub_known(value)
    if isinstance(value, dict):
        return {scrub_known(str(k)): _scrubbed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_scrubbed(v) for v in value]
    return value


def decode_json(raw: bytes | None, name: str = "?") -> object:
    """Stored JSON (payload, result, args) back to a value; PayloadInvalid if it cannot be,
    e.g. a row written in SQL with nesting deeper than the decoder can walk."""
    if raw is None:
        return None
    try:
        return _any_decoder.decode(raw)
    except RecursionError:
        raise PayloadInvalid(name, f"stored value does not decode: {TOO_DEEP}") from None


def storable_text(text: str, max_bytes: int) -> str:
    """Text from user code made fit for a Postgres text column, at most `max_bytes` of UTF-8.

    Handlers raise what the OS gave them: ``os.listdir``, ``sys.argv`` and ``os.environ``
    carry undecodable bytes as lone surrogates, which UTF-8 cannot encode; such a byte is
    kept visible as ``\\xe9``. NUL (which Postgres text cannot hold) becomes ``\\x00``. A text
    over the limit keeps its head and its tail (where a traceback puts the exception) with a
    note of what was cut between them.
    """
    # The log sink's rule: no password this process knows is kept in what is stored.
    raw = _utf8(scrub_known(text).replace("\x00", "\\x00"))
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
