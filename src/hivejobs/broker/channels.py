"""The pub/sub channels: the control channel's messages (cancel, restart) and one job's events
channel, their subscriptions (each owning one pub/sub connection) and the decoding that drops
what anyone who can publish there might write. The keys are listed in the package docstring.
Imports nothing of the package but its clients.
"""

from __future__ import annotations

import time

import msgspec

from hivejobs.broker.clients import Client
from hivejobs.records.events import JobEvent


class ControlMessage(msgspec.Struct, frozen=True, kw_only=True):
    """A message on the control channel: cancel a running job, or recycle pools."""

    action: str  # "cancel" | "restart"
    job_id: str | None = None
    pool: str | None = None
    instance: str | None = None  # restart: only the instance on this host (or host:pid)


_control_decoder = msgspec.json.Decoder(ControlMessage)
_event_decoder = msgspec.json.Decoder(JobEvent)


def decode_control(raw: bytes) -> ControlMessage | None:
    try:
        return _control_decoder.decode(raw)
    except msgspec.DecodeError:
        return None


def events_channel(prefix: str, job_id: str) -> str:
    return f"{prefix}events:{job_id}"


def decode_event(raw: bytes, job_id: str) -> JobEvent | None:
    try:
        event = _event_decoder.decode(raw)
    except msgspec.DecodeError:
        return None
    return event if event.job_id == job_id and event.kind != "end" else None


class ControlSubscription:
    """One pub/sub connection on the control channel, for a pool's liveness thread: owns
    that connection (closed by close()) and hands out decoded messages, dropping what does
    not decode (anyone who can publish may write garbage there)."""

    def __init__(self, client: Client, channel: str) -> None:
        self._pubsub = client.pubsub(  # type: ignore[no-untyped-call,unused-ignore]  # typed from redis 8.2
            ignore_subscribe_messages=True
        )
        self._pubsub.subscribe(channel)

    def get(self, timeout_s: float) -> ControlMessage | None:
        """The next message, or None after `timeout_s` without one."""
        msg = self._pubsub.get_message(timeout=timeout_s)
        return None if msg is None else decode_control(msg["data"])

    def close(self) -> None:
        self._pubsub.close()


class EventSubscription:
    """One pub/sub connection on one job's events channel, for one reader of its stream:
    owns that connection (closed by close()) and hands out decoded events, dropping what does
    not decode or names another job (anyone who can publish may write garbage there)."""

    def __init__(self, client: Client, channel: str, job_id: str) -> None:
        self.job_id = job_id
        self._pubsub = client.pubsub(  # type: ignore[no-untyped-call,unused-ignore]  # typed from redis 8.2
            ignore_subscribe_messages=True
        )
        self._pubsub.subscribe(channel)

    def get(self, timeout_s: float) -> JobEvent | None:
        """The next event, or None after `timeout_s` without one (redis-py answers None
        for a subscribe confirmation too, and we for garbage: both keep waiting)."""
        deadline = time.monotonic() + timeout_s
        while True:
            msg = self._pubsub.get_message(timeout=max(0.0, deadline - time.monotonic()))
            event = None if msg is None else decode_event(msg["data"], self.job_id)
            if event is not None:
                return event
            if time.monotonic() >= deadline:
                return None

    def close(self) -> None:
        self._pubsub.close()
