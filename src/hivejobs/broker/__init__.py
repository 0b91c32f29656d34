"""Redis, the broker: carries job ids only, never payloads or state.

Keys (all under the prefix, default ``hivejobs:``):
  ``{prefix}{<type>}:p<priority>``  list of job ids, RPUSH by enqueuers, completer and
                                  coordinator; BLMPOP from the left by pool fetchers. The type in
                                  braces is a hash tag: one type's priorities share a cluster slot.
  ``{prefix}boot``                  string, set by the coordinator after a full restore; missing
                                  means Redis was flushed or restarted empty (R1), or is new
                                  to this prefix (Postgres records each marker set: 0013).
  ``{prefix}control``               pub/sub channel: cancel/stop/restart messages to pools
                                  (each pool process subscribes: ControlSubscription).
  ``{prefix}wake``                  pub/sub channel: chain ids whose try just finished, from
                                  pools to the coordinator, when Postgres LISTEN is out of
                                  reach (a transaction-mode pooler, no listen URL). A hint:
                                  the periodic traversal finds the same work.
  ``{prefix}events:<job id>``       pub/sub channel: one job's streamed events (JobEvent JSON:
                                  progress, partial results), from the pool running it to
                                  its readers (app.stream, SSE). Live only: a reader who
                                  subscribes late reads the last progress from Postgres.
  ``{prefix}metrics``               hash of fleet-wide counters and histogram buckets (HINCRBY by
                                  pools, coordinator and API; read by /metrics; see metrics.py).
  ``{prefix}tp:<minute>``           hash of jobs finished per type and outcome in that minute
                                  (epoch minute), expires after two hours: the dashboard chart.

Everything here may fail or lose data; Postgres is the truth, so callers treat a Redis error
as latency, never as loss.

The package, by role:
  __init__.py  Broker: one sync client, the key layout, push and pop of ids, queue lengths
               and heads, the boot marker, publishing on the channels
  channels.py  the control channel's messages and one job's events channel: subscriptions
               and decoding
  aio.py       AsyncBroker: the enqueuer's push and a reader's event subscription, for event
               loops
  pusher.py    Pusher: acknowledged jobs' ids pushed off the caller's path, in batches
  fair.py      fair dispatch: per-key lists and the ring of keys, a Lua pop
  clients.py   the Redis client for a single server, Sentinel or Cluster
  hints.py     the one rule for a failed push: log it, the reconciler re-pushes
Imports nothing of ours but records, errors, config, logs, serialization and batching; any
layer above may import it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import msgspec
import redis

from hivejobs.broker.channels import (
    ControlMessage,
    ControlSubscription,
    EventSubscription,
    events_channel,
)
from hivejobs.broker.clients import Client, sync_client
from hivejobs.config import Settings
from hivejobs.errors import ConnectionFailed
from hivejobs.records.jobs import PRIORITIES
from hivejobs.urls import redact_url, scrub, url_secrets

MAX_ID_LENGTH = 255


class KeyRefused(redis.ResponseError):
    """Redis refused a command on one of our keys (e.g. WRONGTYPE: someone SET a list key).
    The message names the key; a redis-py error alone does not."""

    def __init__(self, key: str, exc: Exception, keys: int = 1) -> None:
        more = f" (and {keys - 1} other keys)" if keys > 1 else ""
        super().__init__(f"{key}{more}: {exc}")
        self.key = key


class Popped(msgspec.Struct, frozen=True):
    """Ids one pop took, and the list they came from (a BLMPOP takes from one list)."""

    key: str
    ids: list[str]


class Broker:
    """Owns one Redis client (its connection pool is thread-safe: the threads of a process
    share it) and the key layout above; its only state is a cache of each type's list keys,
    filled once per type (a racing fill writes the same list)."""

    def __init__(self, settings: Settings) -> None:
        self.prefix = settings.prefix
        self.block_s = settings.pop_block_s
        self.url = settings.redis_url
        self.redis: Client = sync_client(
            settings.redis_url,
            socket_timeout=settings.redis_socket_timeout_s,
            socket_connect_timeout=settings.redis_socket_timeout_s,
            health_check_interval=30,
        )
        self._keys: dict[str, list[str]] = {}

    def close(self) -> None:
        self.redis.close()

    def ping(self) -> None:
        """Raise ConnectionFailed with a clear message when Redis does not answer."""
        try:
            self.redis.ping()
        except redis.RedisError as exc:
            reason = scrub(str(exc).strip() or type(exc).__name__, url_secrets(self.url))
            raise ConnectionFailed("Redis", redact_url(self.url), reason) from None

    # -- keys --------------------------------------------------------------------------

    def queue_key(self, name: str, priority: int) -> str:
        return queue_key(self.prefix, name, priority)

    def queue_keys(self, name: str) -> list[str]:
        keys = self._keys.get(name)
        if keys is None:
            keys = self._keys[name] = [self.queue_key(name, p) for p in PRIORITIES]
        return keys

    def queue_keys_glob(self, name: str) -> str:
        """All lists of one type, as a pattern: for logs about a pop, which names no key."""
        return f"{self.prefix}{{{name}}}:p*"

    @property
    def boot_key(self) -> str:
        return f"{self.prefix}boot"

    @property
    def control_channel(self) -> str:
        return f"{self.prefix}control"

    @property
    def metrics_key(self) -> str:
        return f"{self.prefix}metrics"

    def throughput_key(self, minute: int) -> str:
        return f"{self.prefix}tp:{minute}"

    # -- ids ---------------------------------------------------------------------------

    def push(self, name: str, priority: int, ids: Sequence[str]) -> None:
        if ids:
            self.redis.rpush(self.queue_key(name, priority), *ids)

    def push_many(self, entries: Iterable[tuple[str, str, int]], chunk: int = 10_000) -> int:
        """Push (id, type, priority) triples grouped by list, pipelined; returns the count."""
        groups: dict[str, list[str]] = defaultdict(list)
        for job_id, name, priority in entries:
            groups[self.queue_key(name, priority)].append(job_id)
        if len(groups) == 1:
            # The common case (one enqueue, one list): a plain RPUSH costs less Python than
            # a pipeline, which the enqueuing process pays under its GIL.
            ((key, ids),) = groups.items()
            if len(ids) <= chunk:
                try:
                    self.redis.rpush(key, *ids)
                except redis.ResponseError as exc:
                    raise KeyRefused(key, exc) from None
                return len(ids)
        keys: list[str] = []
        sizes: list[int] = []
        with self.redis.pipeline(transaction=False) as pipe:
            for key, ids in groups.items():
                for start in range(0, len(ids), chunk):
                    pipe.rpush(key, *ids[start : start + chunk])
                    keys.append(key)
                    sizes.append(len(ids[start : start + chunk]))
            # A list that refuses (a wrong-typed key) fails alone; the others are pushed.
            replies = pipe.execute(raise_on_error=False)
        failed = [(k, r) for k, r in zip(keys, replies, strict=True) if isinstance(r, Exception)]
        if failed:
            raise KeyRefused(failed[0][0], failed[0][1], len({k for k, _ in failed}))
        return sum(sizes)

    def pop(self, name: str, count: int, block_s: float | None = None) -> Popped:
        """Block up to block_s for ids of one type, highest priority (0) first."""
        keys = self.queue_keys(name)
        reply = self.redis.blmpop(
            block_s if block_s is not None else self.block_s,
            len(keys),
            *keys,
            direction="LEFT",
            count=count,
        )
        if not reply:
            return Popped("", [])
        key: bytes = reply[0]  # type: ignore[assignment]
        raw_ids: list[bytes] = reply[1]  # type: ignore[assignment]
        ids = [clean for raw in raw_ids if (clean := clean_id(raw)) is not None]
        return Popped(key.decode(errors="replace"), ids)

    def queue_lengths(
        self, names: Iterable[str]
    ) -> tuple[dict[tuple[str, int], int], dict[str, redis.ResponseError]]:
        """Lengths of each type's lists, and the keys whose length Redis refused (a key of
        the wrong type): one bad key leaves every other list's length known."""
        queues = [(n, p) for n in names for p in PRIORITIES]
        replies, refused = self._per_queue(queues, lambda pipe, key: pipe.llen(key))
        return {q: int(r) for q, r in replies.items()}, refused

    def queue_heads(
        self, queues: Iterable[tuple[str, int]], count: int
    ) -> tuple[dict[tuple[str, int], list[str]], dict[str, redis.ResponseError]]:
        """The first `count` ids of each list (the next to be popped, the oldest pushed), and
        the keys Redis refused, as in queue_lengths."""
        replies, refused = self._per_queue(
            list(queues), lambda pipe, key: pipe.lrange(key, 0, count - 1)
        )
        heads = {
            q: [c for raw in r if (c := clean_id(raw)) is not None] for q, r in replies.items()
        }
        return heads, refused

    def _per_queue(
        self, queues: list[tuple[str, int]], command: Callable[[Any, str], object]
    ) -> tuple[dict[tuple[str, int], Any], dict[str, redis.ResponseError]]:
        """One pipelined `command` per queue's list; a key Redis refuses fails alone."""
        with self.redis.pipeline(transaction=False) as pipe:
            for n, p in queues:
                command(pipe, self.queue_key(n, p))
            replies = pipe.execute(raise_on_error=False)
        answered: dict[tuple[str, int], Any] = {}
        refused: dict[str, redis.ResponseError] = {}
        for (n, p), reply in zip(queues, replies, strict=True):
            if isinstance(reply, redis.ResponseError):
                refused[self.queue_key(n, p)] = reply
            elif isinstance(reply, Exception):
                raise reply
            else:
                answered[(n, p)] = reply
        return answered, refused

    # -- boot marker -------------------------------------------------------------------

    def boot_marker_present(self) -> bool:
        return bool(self.redis.exists(self.boot_key))

    def set_boot_marker(self, value: str) -> None:
        self.redis.set(self.boot_key, value)

    # -- control channel ---------------------------------------------------------------

    def publish_control(self, message: ControlMessage) -> None:
        self.redis.publish(self.control_channel, msgspec.json.encode(message))

    @property
    def wake_channel(self) -> str:
        return f"{self.prefix}wake"

    def publish_wake(self, chain_ids: Iterable[str]) -> None:
        self.redis.publish(self.wake_channel, ",".join(sorted(set(chain_ids))))

    def subscribe_control(self) -> ControlSubscription:
        """A subscription of its own to the control channel (raises RedisError if down)."""
        return ControlSubscription(self.redis, self.control_channel)

    # -- job events (worker/streaming.py publishes, client/streaming.py reads) ----------

    def events_channel(self, job_id: str) -> str:
        return events_channel(self.prefix, job_id)

    def publish_events(self, messages: Sequence[tuple[str, bytes]]) -> None:
        """(job id, encoded JobEvent) pairs, one pipeline: a pool's events of one moment."""
        with self.redis.pipeline(transaction=False) as pipe:
            for job_id, message in messages:
                pipe.publish(self.events_channel(job_id), message)
            pipe.execute()

    def subscribe_events(self, job_id: str) -> EventSubscription:
        """A subscription of its own to one job's events (raises RedisError if down)."""
        return EventSubscription(self.redis, self.events_channel(job_id), job_id)


def queue_key(prefix: str, name: str, priority: int) -> str:
    """The list of one (type, priority); the type in braces is the cluster hash tag."""
    return f"{prefix}{{{name}}}:p{priority}"


def clean_id(raw: bytes) -> str | None:
    """Garbage in a list (foreign writes, huge values) is dropped, never executed or claimed."""
    if len(raw) > MAX_ID_LENGTH * 4:
        return None
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        return None
    if not text or len(text) > MAX_ID_LENGTH or "\x00" in text:
        return None
    return text
