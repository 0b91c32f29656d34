"""Postgres off this machine without TLS guarantees is said at start, through the real CLI:
libpq's default sslmode=prefer falls back to plain text and checks no certificate. A
loopback server, or sslmode=verify-full, says nothing. (192.0.2.1 is TEST-NET: unreachable,
so each command then fails to connect; the warning comes first.)"""

from __future__ import annotations

from tests.process.cli import cli_env, hivejobs

WARNING = "Postgres connection without TLS guarantees"
REMOTE = "postgresql://app@192.0.2.1:5432/app?connect_timeout=1"


def migrate(database_url: str) -> str:
    env = cli_env(HIVEJOBS_DATABASE_URL=database_url, HIVEJOBS_REDIS_URL="redis://127.0.0.1:6379/0")
    return hivejobs(["migrate"], env).stderr


def test_a_remote_postgres_without_sslmode_is_warned_about(database_url: str) -> None:
    for url in (REMOTE, REMOTE + "&sslmode=prefer", "host=192.0.2.1 dbname=app connect_timeout=1"):
        err = migrate(url)
        assert WARNING in err and "sslmode=verify-full" in err, err
        assert "Postgres at 192.0.2.1 is reached with sslmode=" in err
    for url in (REMOTE + "&sslmode=verify-full", REMOTE + "&sslmode=require", database_url):
        assert WARNING not in migrate(url)
