"""`Unique`: a job type's unique window, and its debounce and coalesce modes.

`@app.job(..., unique=Unique(key=[...], within=60, mode=...))`. The key is the job type and
the payload's `key` fields (the whole payload when `key` is None), in any key order.

- mode="window" (the default) is `unique_for`/`unique_by`: within `within` seconds of an
  enqueue a matching job is not stored again (jobtypes.Unique, store/enqueue.py).
- mode="debounce": the key's enqueues go into one job until it starts. The last enqueue wins
  (its payload, priority and expires_at are the job's), and each one moves the run to
  now + `within` (it runs after `within` seconds of quiet), but never later than `max_wait`
  seconds after the window's first enqueue.
- mode="coalesce": the first enqueue's job runs `within` seconds after it; until it starts,
  each later enqueue of the key is merged into it by `merge(stored, new) -> payload` (the
  payloads as the handler gets them). Its priority is the most urgent of the merged
  enqueues, its expiry the latest.

Once the key's job has started (or ended, or was cancelled), the next enqueue starts a new
window with a new job, whatever happens to the started one. Decided in Postgres under a row
lock per key (store/debounce.py). Checks the declaration at import; never opens a connection.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import msgspec

from hivejobs.errors import InvalidArgument, InvalidJobType, PayloadInvalid
from hivejobs.records.jobs import DebounceClaim
from hivejobs.serialization import PayloadCodec, decode_json

MODES = ("window", "debounce", "coalesce")
MAX_WINDOW_S = 366 * 24 * 3600.0
Merge = Callable[..., object]  # merge(stored, new): any payload types the handler takes
_canonical = msgspec.json.Encoder(order="deterministic")  # key order does not make a new key


@dataclass(frozen=True, kw_only=True)
class Unique:
    """What the user declares; App.job checks it (`debounce_policy`, or for mode="window"
    client/registry.py's checked_unique with App.job's `unique_states` and `on_duplicate`)."""

    key: Sequence[str] | None = None
    within: float
    mode: Literal["window", "debounce", "coalesce"] = "window"
    max_wait: float | None = None
    merge: Merge | None = None


@dataclass(frozen=True)
class Debounce:
    """A job type's checked debounce or coalesce policy; builds each enqueue's claim."""

    mode: Literal["debounce", "coalesce"]
    within_s: float
    max_wait_s: float | None
    by: tuple[str, ...] | None
    merge: Merge | None

    def claim(self, name: str, payload: bytes, codec: PayloadCodec) -> DebounceClaim:
        value = decode_json(payload)
        if self.by is not None:
            if not isinstance(value, dict):
                raise PayloadInvalid(name, f"unique key {list(self.by)} needs a JSON object")
            value = {field: value.get(field) for field in self.by}
        digest = hashlib.sha256(_canonical.encode(value)).hexdigest()
        return DebounceClaim(
            key=f"{name}:{digest}",
            mode=self.mode,
            within_s=self.within_s,
            max_wait_s=self.max_wait_s,
            merge=None if self.merge is None else _bytes_merge(name, self.merge, codec),
        )


def _bytes_merge(name: str, merge: Merge, codec: PayloadCodec) -> Callable[[bytes, bytes], bytes]:
    """The merge on stored bytes: decoded as the handler would get them, the result checked
    and encoded as a new payload is. A merge that raises refuses the enqueue."""

    def merged(stored: bytes, new: bytes) -> bytes:
        try:
            result = merge(codec.decode(stored), codec.decode(new))
        except Exception as exc:
            raise InvalidArgument(
                f"merge of job type {name!r} raised {exc!r}: the enqueue stored nothing"
            ) from exc
        return codec.encode(result)

    return merged


def checked_seconds(field: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidJobType(f"unique {field} must be seconds, not {type(value).__name__}")
    if not (0 < value <= MAX_WINDOW_S) or not math.isfinite(value):  # also refuses NaN
        raise InvalidJobType(
            f"unique {field} must be between 0 and {MAX_WINDOW_S:.0f} s, not {value}"
        )
    return float(value)


def checked_key(key: object) -> tuple[str, ...] | None:
    if key is None:
        return None
    if isinstance(key, str) or not isinstance(key, Sequence):
        raise InvalidJobType("unique key must be a list of payload field names, or None")
    if not key or not all(isinstance(f, str) for f in key):
        raise InvalidJobType("unique key must be a list of payload field names, or None")
    return tuple(key)


def debounce_policy(unique: object) -> Debounce | None:
    """The checked policy of a debounce or coalesce `Unique`; None for mode="window"."""
    if not isinstance(unique, Unique):
        raise InvalidJobType(f"unique must be a hivejobs.Unique, not {type(unique).__name__}")
    if unique.mode not in MODES:
        raise InvalidJobType(f"unique mode must be one of {MODES}, not {unique.mode!r}")
    within = checked_seconds("within", unique.within)
    by = checked_key(unique.key)
    if unique.mode == "window":
        for field in ("max_wait", "merge"):
            if getattr(unique, field) is not None:
                raise InvalidJobType(f"unique {field} needs mode='debounce' or 'coalesce'")
        return None
    max_wait = None if unique.max_wait is None else checked_seconds("max_wait", unique.max_wait)
    if max_wait is not None and unique.mode != "debounce":
        raise InvalidJobType("unique max_wait needs mode='debounce' (coalesce runs at `within`)")
    if max_wait is not None and max_wait < within:
        raise InvalidJobType(f"unique max_wait ({max_wait}) must be at least within ({within})")
    if unique.mode == "coalesce" and not callable(unique.merge):
        raise InvalidJobType("unique merge: mode='coalesce' needs merge=fn(stored, new)")
    if unique.mode == "debounce" and unique.merge is not None:
        raise InvalidJobType("unique merge needs mode='coalesce' (debounce keeps the last)")
    mode: Literal["debounce", "coalesce"] = "debounce" if unique.mode == "debounce" else "coalesce"
    return Debounce(mode, within, max_wait, by, unique.merge)
