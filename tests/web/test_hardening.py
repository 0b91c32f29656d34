"""What a real `hivejobs serve` answers to input and faults an attacker (or bad luck) brings:
a 4xx naming the field instead of a 500 and a traceback, no server address in a 503, and the
enqueue bounds of the Python API."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from hivejobs import App
from hivejobs.logs import MSG_LIBRARY
from tests.harness import REDIS_URL, PostgresServer, sql, wait_until
from tests.web.conftest import Server

DB_NAME = "dbname_marker_for_503"


def library_lines(server: Server) -> list[dict[str, Any]]:
    """The serve log's records of lines a library logged; every line must be JSON."""
    lines = server.log_path.read_text().splitlines()
    records = [json.loads(line)["record"] for line in lines if line.strip()]
    return [r for r in records if r["message"] == MSG_LIBRARY]


def stored(url: str) -> int:
    return int(sql(url, "SELECT count(*) FROM hivejobs_job")[0][0])


@pytest.mark.parametrize("run_at", ["0001-01-01T00:00:00Z", "9999-12-31T00:00:00Z"])
def test_run_at_out_of_bounds_is_a_422_naming_it(
    server: Server, database_url: str, run_at: str
) -> None:
    r = server.client.post("/v1/jobs/echo", json={"data": {"text": "a"}, "run_at": run_at})
    assert r.status_code == 422, r.text
    assert "run_at must be between" in r.json()["error"]
    assert stored(database_url) == 0


@pytest.fixture
def own_postgres() -> Iterator[PostgresServer]:
    server = PostgresServer()
    yield server
    server.close()


def test_a_503_with_postgres_down_names_no_server(
    own_postgres: PostgresServer, start_server: Callable[..., Server], redis_prefix: str
) -> None:
    url = own_postgres.url.rsplit("/", 1)[0] + f"/{DB_NAME}"
    App(database_url=url, redis_url=REDIS_URL).migrate()
    env = {"HIVEJOBS_DATABASE_URL": url, "HIVEJOBS_PREFIX": redis_prefix}
    server = start_server(env={**env, "HIVEJOBS_LOG_FORMAT": "json"})
    own_postgres.stop_immediate()
    r = server.client.post("/v1/jobs/echo", json={"data": {"text": "a"}})
    assert r.status_code == 503, r.text
    assert r.json()["error"] == "Postgres does not answer; retry later"
    for leak in (DB_NAME, str(own_postgres.port), "postgres@", "127.0.0.1"):
        assert leak not in r.text

    # The pool's own complaints (psycopg logs through `logging`) leave through our sink: JSON
    # like every other line, scrubbed, never through a root handler Litestar installed.
    wait_until(lambda: library_lines(server), what="psycopg's pool to log the refused connection")
    assert {r["extra"]["library"] for r in library_lines(server)} <= {"psycopg.pool", "psycopg"}


def test_uvicorn_lines_leave_through_our_sink(start_server: Callable[..., Server]) -> None:
    """A malformed request makes uvicorn warn: a JSON line from our sink, like ours."""
    server = start_server(env={"HIVEJOBS_LOG_FORMAT": "json"})
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"\x00\x01 not http at all\r\n\r\n")
        sock.recv(1024)

    wait_until(lambda: library_lines(server), what="uvicorn to log the malformed request")
    assert {r["extra"]["library"] for r in library_lines(server)} == {"uvicorn.error"}
