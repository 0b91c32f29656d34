"""Broker URLs for Sentinel and Cluster, and the pooler settings: parsed without servers."""

from __future__ import annotations

import pytest

from hivejobs.broker.clients import Target
from hivejobs.config import settings_from_env
from hivejobs.errors import ConfigError
from hivejobs.store.session_settings import connect_kwargs, local_settings_sql, pooler_refused
from hivejobs.urls import parse_redis_url, redact_url, url_secrets


def test_sentinel_url() -> None:
    t = Target(
        "rediss+sentinel://app:s%40cret@10.0.0.1:26379,[::1]:26380/mymaster/2"
        "?ssl_ca_certs=/ca.pem&sentinel_password=sp"
    )
    assert t.kind == "sentinel"
    assert t.hosts == [("10.0.0.1", 26379), ("::1", 26380)]
    assert t.service == "mymaster"
    assert t.kwargs["db"] == 2
    assert t.kwargs["username"] == "app" and t.kwargs["password"] == "s@cret"
    assert t.kwargs["ssl"] is True and t.kwargs["ssl_ca_certs"] == "/ca.pem"
    assert t.sentinel_kwargs == {"password": "sp"}


def test_cluster_url() -> None:
    t = Target("redis+cluster://h1:7000,h2:7001")
    assert (t.kind, t.hosts) == ("cluster", [("h1", 7000), ("h2", 7001)])
    assert "db" not in t.kwargs and "ssl" not in t.kwargs


def test_the_client_and_the_redaction_read_the_url_alike() -> None:
    """One parser (urls.parse_redis_url): the password the client sends is the one
    redaction hides, '#' percent-encoded included."""
    url = "REDISS+sentinel://app:s%23cret@h1:26379,h2:26380/mymaster/3?ssl_ca_certs=/ca.pem"
    parsed = parse_redis_url(url)
    assert (parsed.base, parsed.kind, parsed.service) == ("rediss", "sentinel", "mymaster")
    assert parsed.hosts == ["h1:26379", "h2:26380"]
    t = Target(url)
    assert t.kwargs["password"] == parsed.params["password"] == "s#cret"
    assert (t.kwargs["db"], t.kwargs["ssl"], t.service) == (3, True, "mymaster")
    assert "s#cret" in url_secrets(url)
    assert redact_url(url) == "rediss+sentinel://app:***@h1:26379,h2:26380/mymaster/3"
    one = "unix:///tmp/r.sock?db=2&password=pw2"
    assert parse_redis_url(one).params["password"] == "pw2"
    assert redact_url(one) == "unix://:***@/tmp/r.sock?db=2"


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis+sentinel://h1:26379", "name the master"),
        ("redis+sentinel://h1/mymaster", "host:port"),
        ("redis+cluster:///", "no host"),
        ("redis+ring://h:1", "starts with"),
    ],
)
def test_bad_urls_say_what_is_wrong(url: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        Target(url)


def test_settings_accept_the_schemes_and_pooler_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HIVEJOBS_PGBOUNCER", "1")
    monkeypatch.setenv("HIVEJOBS_LISTEN_DATABASE_URL", "postgresql://db-direct/app")
    s = settings_from_env("postgresql://pgbouncer:6432/app", "redis+cluster://h1:7000")
    assert s.pgbouncer is True and s.listen_database_url == "postgresql://db-direct/app"
    monkeypatch.setenv("HIVEJOBS_PGBOUNCER", "maybe")
    with pytest.raises(ConfigError, match="HIVEJOBS_PGBOUNCER"):
        settings_from_env("postgresql://h/app", "redis://h")


def test_pooled_connections_send_no_options_and_prepare_nothing() -> None:
    session = {"lock_timeout": "2000"}
    assert connect_kwargs(True, session) == {
        "autocommit": True,
        "connect_timeout": 5,
        "prepare_threshold": None,
    }
    assert connect_kwargs(False, session)["options"] == "-c lock_timeout=2000"
    assert local_settings_sql(session) == b"SELECT set_config('lock_timeout', '2000', true)"
    refused = pooler_refused("FATAL:  unsupported startup parameter: options")
    assert refused is not None and "HIVEJOBS_PGBOUNCER=1" in str(refused)
    assert pooler_refused("password authentication failed") is None
