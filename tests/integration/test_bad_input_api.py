"""The API against real Postgres and Redis: bad input raises hivejobs' own errors (never
UnicodeEncodeError, RecursionError, psycopg.DataError or UndefinedFunction) and stores nothing.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import psycopg
import pytest

from hivejobs import (
    App,
    ChainInvalid,
    ChainNotFound,
    ConfigError,
    ConnectionFailed,
    InvalidArgument,
    PayloadInvalid,
)
from hivejobs.chains import Chain
from hivejobs.store import create_database_if_missing
from tests.harness import sql

SURROGATE = b"caf\xe9".decode("utf-8", "surrogateescape")


def deep(levels: int) -> list[object]:
    value: list[object] = []
    for _ in range(levels):
        value = [value]
    return value


def server(admin_url: str) -> str:
    """host:port of the test server's admin URL (postgresql://user@host:port/postgres)."""
    return admin_url.split("@", 1)[1].rsplit("/", 1)[0]


def stored(url: str) -> tuple[int, int]:
    jobs = sql(url, "SELECT count(*) FROM hivejobs_job")[0][0]
    chains = sql(url, "SELECT count(*) FROM hivejobs_chain")[0][0]
    return int(jobs), int(chains)


@pytest.fixture
def app(make_app: Callable[..., App]) -> App:
    app = make_app()
    app.job("echo")(lambda ctx, payload: payload)
    return app


@pytest.mark.parametrize("job_id", ["a\x00b", "a\u202eb", SURROGATE, 5, None, "x" * 300], ids=repr)
def test_lookups_with_bad_ids_raise_invalid_argument(app: App, job_id: object) -> None:
    """get_job("a\\x00b") raised psycopg.DataError and get_job(5) UndefinedFunction."""
    for call in (app.get_job, app.cancel, app.replay):
        with pytest.raises(InvalidArgument):
            call(job_id)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"file": SURROGATE}, "not valid Unicode"),
        (deep(2_000), "nested too deeply"),
        ({"ratio": float("nan")}, "NaN and infinity"),
        ([1.0, float("inf")], "NaN and infinity"),
    ],
    ids=["surrogate", "deep", "nan", "inf"],
)
def test_bad_payloads_raise_payload_invalid_and_store_nothing(
    app: App, database_url: str, payload: object, message: str
) -> None:
    with pytest.raises(PayloadInvalid, match=message):
        app.enqueue("echo", payload)
    with pytest.raises(PayloadInvalid, match=message):
        app.enqueue_many("echo", [{"ok": 1}, payload])
    assert stored(database_url) == (0, 0)


def test_bad_chains_raise_chain_invalid_and_store_nothing(app: App, database_url: str) -> None:
    cases: list[tuple[Chain, str]] = []
    chain = Chain("deep args", args={"a": deep(5_000)})
    chain.job("echo", {})
    cases.append((chain, "nested too deeply"))
    chain = Chain("nul\x00name")
    chain.job("echo", {})
    cases.append((chain, "contains NUL"))
    chain = Chain("surrogate payload")
    chain.job("echo", {"f": SURROGATE})
    cases.append((chain, "not valid Unicode"))
    for bad, message in cases:
        with pytest.raises(ChainInvalid, match=message):
            app.run_chain(bad)
    deep_file = b'{"name":"x","jobs":[{"key":"a","type":"echo","payload":' + b"[" * 3000
    with pytest.raises(ChainInvalid, match="nested too deeply"):
        Chain.from_json(deep_file + b"]" * 3000 + b"}]}")
    assert stored(database_url) == (0, 0)


@pytest.mark.parametrize("request_id", ["a\x00b", "not-a-request-id", "A" * 32])
def test_chain_lookups_with_bad_ids_raise_chain_not_found(app: App, request_id: str) -> None:
    with pytest.raises(ChainNotFound):
        app.chain_status(request_id)
    with pytest.raises(ChainNotFound):
        app.stop_chain(request_id)


@pytest.mark.parametrize("limit", [-5, 0, True, 10**9])
def test_list_chains_with_a_bad_limit_raises_invalid_argument(app: App, limit: int) -> None:
    with pytest.raises(InvalidArgument, match="limit"):
        app.list_chains(limit)


def test_a_missing_role_is_reported_as_a_role_not_a_missing_database(admin_url: str) -> None:
    """`hivejobs migrate` with a mistyped role said the database was missing (and showed the
    password of the key=value conninfo it built)."""
    url = f"postgresql://nosuchrole18b:Zq9MarkerPw@{server(admin_url)}/hj18b_never"
    with pytest.raises(ConnectionFailed) as info:
        create_database_if_missing(url)
    text = str(info.value)
    assert 'role "nosuchrole18b" does not exist' in text
    assert "the user name in the URL is wrong" in text
    assert "hivejobs migrate" not in text
    assert "Zq9MarkerPw" not in text


def test_migrate_without_createdb_says_so(admin_url: str) -> None:
    role = f"hj18b_nocreatedb_{uuid.uuid4().hex[:8]}"  # its own: a shared server's roles stay
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN NOCREATEDB")
    try:
        target = f"postgresql://{role}@{server(admin_url)}/hj18b_not_created"
        with pytest.raises(ConfigError) as info:
            App(database_url=target, redis_url="redis://127.0.0.1:6379/0").migrate()
        assert "may not create it" in str(info.value)
        assert "grant CREATEDB" in str(info.value)
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f"DROP ROLE IF EXISTS {role}")
