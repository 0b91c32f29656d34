"""No secret in any output: the real CLI, failing on purpose with a marker
password in every DSN form; the marker must appear in no line of stdout or stderr (logs at
DEBUG, errors, tracebacks). Also: `hivejobs run` checks Redis at start, and a bench that fails
leaves no database or temp dir behind."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import PostgresServer, sql
from tests.process.cli import PasswordRedis, cli_env, hivejobs

MARK = "Zq9MarkerPw"
APP = "tests.apps.inputapp:app"


@pytest.fixture
def password_redis(tmp_path: Path) -> Iterator[PasswordRedis]:
    server = PasswordRedis(tmp_path, "the-right-password")
    yield server
    server.stop()


def server(admin_url: str) -> str:
    """host:port of the test Postgres (admin URL postgresql://user@host:port/postgres)."""
    return admin_url.split("@", 1)[1].rsplit("/", 1)[0]


def user(admin_url: str) -> str:
    return admin_url.split("://", 1)[1].split("@", 1)[0]


def bad_database_urls(admin_url: str) -> dict[str, str]:
    """A role that does not exist, its password the marker, in every DSN form."""
    host, port = server(admin_url).split(":")
    return {
        "url": f"postgresql://nosuchrole18b:{MARK}@{host}:{port}/hj18b_x",
        "query": f"postgresql://{host}:{port}/hj18b_x?user=nosuchrole18b&password={MARK}",
        "keyvalue": f"host={host} port={port} user=nosuchrole18b password={MARK} dbname=hj18b_x",
        "hash-slash": f"postgresql://nosuchrole18b:{MARK}#{MARK}/{MARK}@{host}:{port}/hj18b_x",
        "encoded": f"postgresql://nosuchrole18b:{MARK}%23%2F@{host}:{port}/hj18b_x",
        "wrong-port": f"postgresql://{user(admin_url)}:{MARK}@{host}:1/hj18b_x",
    }


def commands(database_url: str, redis_url: str) -> list[list[str]]:
    return [
        ["migrate"],
        ["run", APP],
        ["enqueue", "--app", APP, "untyped", "{}"],
        ["status", "some-job"],
        ["restart"],
        ["chain", "list"],
        ["bench", "--scenarios", "enqueue", "--jobs", "10", "--repeats", "1"]
        + ["--database-url", database_url, "--redis-url", redis_url],
    ]


def assert_no_marker(args: list[str], out: str, err: str) -> None:
    shown = [a if MARK not in a else "<url>" for a in args]
    for stream, text in (("stdout", out), ("stderr", err)):
        assert MARK not in text, f"{shown}: marker password in {stream}:\n{text}"


@pytest.mark.parametrize("form", list(bad_database_urls("postgresql://u@h:5432/p")))
def test_no_database_password_in_any_output(
    admin_url: str, redis_prefix: str, form: str, tmp_path: Path
) -> None:
    database_url = bad_database_urls(admin_url)[form]
    redis_url = "redis://127.0.0.1:6379/0"
    env = cli_env(
        HIVEJOBS_DATABASE_URL=database_url,
        HIVEJOBS_REDIS_URL=redis_url,
        HIVEJOBS_PREFIX=redis_prefix,
        HIVEJOBS_LOG_LEVEL="DEBUG",
        TMPDIR=str(tmp_path),
    )
    for args in commands(database_url, redis_url):
        done = hivejobs(args, env)
        assert_no_marker(args, done.stdout, done.stderr)
        if args[0] != "restart":  # restart only needs Redis, which answers
            assert done.returncode in (1, 2), (args[0], done.stderr)
            assert "Traceback" not in done.stderr, done.stderr
    assert list(tmp_path.iterdir()) == []  # the failed bench left no temp dir


def test_migrate_with_a_wrong_role_says_the_role_is_wrong(admin_url: str) -> None:
    database_url = bad_database_urls(admin_url)["url"]
    done = hivejobs(["migrate"], cli_env(HIVEJOBS_DATABASE_URL=database_url))
    assert done.returncode == 1
    assert 'role "nosuchrole18b" does not exist' in done.stderr
    assert "the user name in the URL is wrong" in done.stderr
    assert "run `hivejobs migrate`" not in done.stderr
    assert "postgresql://nosuchrole18b:***@" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("form", ["url", "url-user", "query", "unix"])
def test_no_redis_password_in_any_output(
    database_url: str,
    redis_prefix: str,
    password_redis: PasswordRedis,
    admin_url: str,
    form: str,
    tmp_path: Path,
) -> None:
    """A wrong Redis password (or a missing socket): `run` exits 1 at start with the reason
    and the URL redacted (it used to start and log a warning per pool per second)."""
    port = password_redis.port
    redis_url = {
        "url": f"redis://:{MARK}@127.0.0.1:{port}/0",
        "url-user": f"redis://default:{MARK}@127.0.0.1:{port}/0",
        "query": f"redis://127.0.0.1:{port}/0?password={MARK}",
        "unix": f"unix://{tmp_path}/no-such.sock?password={MARK}",
    }[form]
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = cli_env(
        HIVEJOBS_DATABASE_URL=database_url,
        HIVEJOBS_REDIS_URL=redis_url,
        HIVEJOBS_PREFIX=redis_prefix,
        HIVEJOBS_LOG_LEVEL="DEBUG",
        TMPDIR=str(tmp),
    )
    bench_server = f"postgresql://{user(admin_url)}@{server(admin_url)}/postgres"
    for args in commands(bench_server, redis_url):
        done = hivejobs(args, env, timeout=30)  # `run` used to keep running
        assert_no_marker(args, done.stdout, done.stderr)
        assert "Traceback" not in done.stderr, done.stderr
        if args[0] in ("run", "restart", "bench"):
            assert done.returncode == 1, (args[0], done.stderr)
            assert "cannot reach Redis at" in done.stderr, done.stderr
            assert ":***@" in done.stderr, done.stderr
    if form != "unix":
        assert "invalid username-password pair" in done.stderr or "WRONGPASS" in done.stderr
    assert list(tmp.iterdir()) == []  # the failed bench left no temp dir


def test_a_bench_failing_on_redis_auth_leaves_no_database_or_temp_dir(
    password_redis: PasswordRedis, tmp_path: Path
) -> None:
    """On a Postgres of its own (other benches may share the test server): nothing left."""
    pg = PostgresServer()
    try:
        before = {r[0] for r in sql(pg.url, "SELECT datname FROM pg_database")}
        redis_url = f"redis://:{MARK}@127.0.0.1:{password_redis.port}/0"
        args = ["bench", "--scenarios", "enqueue", "--jobs", "10", "--repeats", "1"]
        args += ["--database-url", pg.url, "--redis-url", redis_url]
        (tmp_path / "tmp").mkdir()
        done = hivejobs(args, cli_env(TMPDIR=str(tmp_path / "tmp")), timeout=60)
        assert done.returncode == 1, done.stderr
        assert "cannot reach Redis at redis://:***@127.0.0.1" in done.stderr
        assert_no_marker(args, done.stdout, done.stderr)
        assert {r[0] for r in sql(pg.url, "SELECT datname FROM pg_database")} == before
        assert list((tmp_path / "tmp").iterdir()) == []
    finally:
        pg.close()


def test_settings_repr_in_a_child_process_hides_passwords() -> None:
    import subprocess
    import sys

    code = (
        "from hivejobs import App; "
        f"a = App(database_url='postgresql://u:{MARK}@h/db', redis_url='redis://:{MARK}@h:1/0'); "
        "print(repr(a.settings)); print(a.settings)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=cli_env(), capture_output=True, text=True, check=True
    )
    assert MARK not in done.stdout and "postgresql://u:***@h/db" in done.stdout
