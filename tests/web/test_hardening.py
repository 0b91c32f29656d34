"""What a real `hivejobs serve` answers to input and faults an attacker (or bad luck) brings:
a 4xx naming the field instead of a 500 and a traceback, no server address in a 503, and the
enqueue bounds of the Python API."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import psycopg
import pytest

from hivejobs import App
from hivejobs.logs import MSG_LIBRARY
from tests.harness import REDIS_URL, Instance, PostgresServer, sql, wait_until
from tests.web.conftest import Server

DB_NAME = "dbname_marker_for_503"


def library_lines(server: Server) -> list[dict[str, Any]]:
    """The serve log's records of lines a library logged; every line must be JSON but the
    dashboard's URL, which `serve` prints on stdout (the log holds both streams)."""
    lines = server.log_path.read_text().splitlines()
    logged = [line for line in lines if line.strip() and not line.startswith("dashboard: ")]
    records = [json.loads(line)["record"] for line in logged]
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


NUL_REQUESTS = [
    ("GET", "/v1/jobs?state=failed&type=a%00b", None, "type"),
    ("GET", "/v1/jobs?state=failed&after=a%00b", None, "after"),
    ("GET", "/v1/chains?after=a%00b", None, "after"),
    ("GET", "/dashboard/types/a%00b", None, "name"),
    (
        "POST",
        "/v1/jobs/remote/some-id",
        b'{"status":"failed","attempt":1,"error":"a\\u0000b"}',
        "error",
    ),
]


def test_nul_and_deep_input_is_a_4xx_naming_the_field(server: Server) -> None:
    deep = b'{"data": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    requests = [*NUL_REQUESTS, ("POST", "/v1/jobs/echo", deep, "nested")]
    for method, path, body, field in requests:
        headers = {"content-type": "application/json"} if body else {}
        r = server.client.request(method, path, content=body, headers=headers)
        assert 400 <= r.status_code < 500, (path, r.status_code, r.text)
        assert field in r.json()["error"], (path, r.text)
    assert "Traceback" not in server.log_path.read_text()


def test_a_stop_that_deadlocks_is_retried_inside(
    server: Server, fleet: Callable[..., Instance], database_url: str
) -> None:
    """The traverser's lock order against the stop's, played by this test's transaction: it
    holds a running try's row, the stop takes the chain's row and waits for the try's, then
    this transaction asks for the chain's row. Postgres breaks the cycle by rolling the stop
    back (this session waits longer before it checks); the stop runs again: 200, not 503."""
    fleet()
    chain = {"name": "pipe", "jobs": [{"key": "a", "type": "hold", "payload": {}}]}
    chain_id = server.client.post("/v1/chains", json=chain).json()["id"]
    query = (
        "SELECT j.id FROM hivejobs_job j JOIN hivejobs_chain_job c ON c.job_id = j.id "
        "WHERE c.chain_id = %s AND j.state = 'running'"
    )
    wait_until(lambda: sql(database_url, query, (chain_id,)), what="the chain's try to run")
    ((try_id,),) = sql(database_url, query, (chain_id,))
    answers: list[httpx.Response] = []
    with psycopg.connect(database_url) as conn:
        conn.execute("SET deadlock_timeout = '60s'")
        conn.execute("SELECT 1 FROM hivejobs_job WHERE id = %s FOR UPDATE", (try_id,))
        stop = threading.Thread(
            target=lambda: answers.append(server.client.post(f"/v1/chains/{chain_id}/stop"))
        )
        stop.start()

        def stop_waits() -> bool:
            rows = sql(
                database_url,
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND datname = current_database() AND query LIKE %s",
                ("%SET cancel_requested%",),
            )
            return bool(rows[0][0])

        wait_until(stop_waits, what="the stop to wait for the try's row")
        conn.execute("UPDATE hivejobs_chain SET wake_at = wake_at WHERE id = %s", (chain_id,))
    stop.join(30)
    assert answers and answers[0].status_code == 200, answers and answers[0].text
    assert sql(
        database_url, "SELECT stop_requested FROM hivejobs_chain WHERE id = %s", (chain_id,)
    ) == [(True,)]
    assert "Traceback" not in server.log_path.read_text()
