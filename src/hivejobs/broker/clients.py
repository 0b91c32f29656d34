"""Redis clients for the broker, from one URL: a single server, Sentinel or Cluster.

  ``redis://`` / ``rediss://`` / ``unix://``   one server (redis-py's from_url)
  ``redis+sentinel://[user:pw@]host:port,host:port/<master>[/<db>]``   the master that
      the sentinels name, found again after a failover (redis-py's Sentinel.master_for);
      a returning old master is never written to, sentinels no longer name it
  ``redis+cluster://[user:pw@]host:port,host:port``   a Redis Cluster (RedisCluster):
      our keys are hash-tagged per job type, so every multi-key command stays on one node
  ``rediss+...``   the same over TLS. Query parameters (``ssl_ca_certs``, ``ssl_certfile``,
      ``ssl_keyfile``, ``ssl_cert_reqs``, ``db`` ...) are redis-py's own; for the sentinels
      themselves ``sentinel_username`` / ``sentinel_password``.

Knows nothing of keys or job ids (broker/); never logs a URL (urls.redact_url does), and
parses none itself (urls.parse_redis_url, which redaction reads too).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.sentinel
import redis.cluster
import redis.sentinel
from redis.cluster import RedisCluster
from redis.connection import SSLConnection

from hivejobs.errors import ConfigError
from hivejobs.urls import parse_redis_url

Client = redis.Redis | RedisCluster
AsyncClient = redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster
# redis-py leaves these untyped; their types as we call them.
Sentinel = cast(Callable[..., redis.sentinel.Sentinel], redis.sentinel.Sentinel)
AsyncSentinel = cast(
    Callable[..., redis.asyncio.sentinel.Sentinel], redis.asyncio.sentinel.Sentinel
)
ClusterNode = cast(Callable[[str, int], redis.cluster.ClusterNode], redis.cluster.ClusterNode)


class Target:
    """A broker URL as the clients need it: which kind, the hosts, and redis-py's connection
    arguments. urls.parse_redis_url takes the URL apart; this refuses what cannot open."""

    def __init__(self, url: str) -> None:
        scheme, sep, _ = url.partition("://")
        base, _, self.kind = scheme.lower().partition("+")
        kinds = ("", "sentinel", "cluster")
        if not sep or base not in ("redis", "rediss", "unix") or self.kind not in kinds:
            raise ConfigError(
                "a Redis URL starts with redis://, rediss://, unix://, redis+sentinel:// "
                "or redis+cluster://"
            )
        self.url = url
        self.hosts: list[tuple[str, int]] = []
        self.service = ""
        self.kwargs: dict[str, Any] = {}
        self.sentinel_kwargs: dict[str, Any] = {}
        if not self.kind:
            return
        parsed = parse_redis_url(url)
        for item in parsed.hosts:
            host, _, port = item.rpartition(":")
            if not host or not port.isdigit():
                raise ConfigError(f"{scheme} URL: {item!r} should be host:port")
            self.hosts.append((host.strip("[]"), int(port)))
        if not self.hosts:
            raise ConfigError(f"{scheme} URL names no host:port")
        if self.kind == "sentinel" and not parsed.service:
            raise ConfigError("redis+sentinel URL: name the master, as /mymaster")
        self.service = parsed.service
        kwargs = dict(parsed.params)
        for key in ("host", "port"):
            kwargs.pop(key, None)
        if kwargs.pop("connection_class", None) is SSLConnection:
            kwargs["ssl"] = True
        for key in ("sentinel_username", "sentinel_password"):
            if key in kwargs:
                self.sentinel_kwargs[key.removeprefix("sentinel_")] = kwargs.pop(key)
        if self.kind == "cluster":
            kwargs.pop("db", None)  # a cluster has database 0 only
        self.kwargs = kwargs


def sync_client(url: str, **options: Any) -> Client:
    """A client for `url`; `options` (timeouts, health checks) apply to every connection."""
    target = Target(url)
    if target.kind == "sentinel":
        sentinel = Sentinel(
            target.hosts,
            sentinel_kwargs={**_tls(target.kwargs), **options, **target.sentinel_kwargs},
            **options,
        )
        master_for = cast(Callable[..., redis.Redis], sentinel.master_for)
        return master_for(target.service, **target.kwargs, **options)
    if target.kind == "cluster":
        return RedisCluster(
            startup_nodes=[ClusterNode(h, p) for h, p in target.hosts],
            **target.kwargs,
            **options,
        )
    return redis.Redis.from_url(url, **options)


def async_client(url: str, **options: Any) -> AsyncClient:
    """The same for an event loop (redis.asyncio)."""
    target = Target(url)
    options = {k: v for k, v in options.items() if k != "health_check_interval"}
    if target.kind == "sentinel":
        sentinel = AsyncSentinel(
            target.hosts,
            sentinel_kwargs={**_tls(target.kwargs), **options, **target.sentinel_kwargs},
            **options,
        )
        master: redis.asyncio.Redis = sentinel.master_for(
            target.service, **target.kwargs, **options
        )
        return master
    if target.kind == "cluster":
        return redis.asyncio.cluster.RedisCluster(
            startup_nodes=[redis.asyncio.cluster.ClusterNode(h, p) for h, p in target.hosts],
            **target.kwargs,
            **options,
        )
    return redis.asyncio.Redis.from_url(url, **options)


def _tls(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The TLS arguments, for the sentinels (which listen with the same certificates)."""
    return {k: v for k, v in kwargs.items() if k == "ssl" or k.startswith("ssl_")}
