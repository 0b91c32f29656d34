"""The token guard over every route of the ASGI app, taken from Litestar's own route table:
a route added later is covered by construction, whichever module declares it.

A write (any method but GET/HEAD/OPTIONS) and any route marked `opt=ADMIN` needs an admin
token: a read token gets 403 and changes nothing. Every route not marked public needs a
token: none, or one not configured, gets 401. In process (Litestar's TestClient) over a
real App, so a route the guard let through reaches its handler and the database.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

import pytest
from litestar import Litestar
from litestar.testing import TestClient

from hivejobs import App
from hivejobs.web import create_app
from tests.harness import sql

ADMIN = "admin-token-of-the-guard-test"  # 20 characters or more, as create_app requires
READER = "read-token-of-the-guard-test"
# OPTIONS is Litestar's own preflight answer on every path (no handler of ours runs).
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")
WRITES = frozenset(METHODS) - {"GET", "HEAD"}


def route_table() -> list[tuple[str, str, dict[str, object]]]:
    """(method, path, opt) of every handler the app serves, from the app itself."""
    offline = App(database_url="postgresql://127.0.0.1:1/x", redis_url="redis://127.0.0.1:1")
    asgi = create_app(offline, read_tokens=[READER], admin_tokens=[ADMIN])
    table = []
    for route in asgi.routes:
        for handler in getattr(route, "route_handlers", []):
            for method in sorted(getattr(handler, "http_methods", ())):
                if method in METHODS:
                    table.append((method, route.path, dict(handler.opt)))
    return sorted(table, key=lambda r: (r[1], r[0]))  # the same order in every xdist worker


ROUTES = route_table()
GUARDED = [(m, p) for m, p, opt in ROUTES if not opt.get("public")]
ADMIN_ONLY = [
    (m, p) for m, p, opt in ROUTES if not opt.get("public") and (opt.get("admin") or m in WRITES)
]


def ids(routes: list[tuple[str, str]]) -> list[str]:
    return [f"{m} {p}" for m, p in routes]


@pytest.fixture
def served(
    make_app: Callable[..., App], database_url: str
) -> Iterator[tuple[TestClient[Litestar], str]]:
    """A client of the app over a real store holding one queued job (`{name}/{job_id}`)."""
    app = make_app()
    app.job("thing")(lambda ctx, payload: None)
    app.connections.store.upsert_job_types([jt.info() for jt in app.types.values()])
    job_id = app.enqueue("thing", {})
    asgi = create_app(app, read_tokens=[READER], admin_tokens=[ADMIN])
    with TestClient(asgi) as client:
        yield client, job_id


def concrete(path: str, job_id: str) -> str:
    """The route's path with its parameters filled in: the stored job's where it has one."""
    values = {"name": "thing", "job_id": job_id, "request_id": job_id, "path": "swagger"}
    return re.sub(r"\{(\w+):\w+\}", lambda m: values.get(m.group(1), "x"), path)


def send(client: TestClient[Litestar], method: str, path: str, token: str | None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    body: dict[str, object] | None = {"data": {}} if method in WRITES else None
    return client.request(method, path, headers=headers, json=body).status_code


def job_rows(database_url: str) -> list[tuple[object, ...]]:
    return [
        tuple(r)
        for r in sql(
            database_url,
            "SELECT id, state, attempt, cancel_requested FROM hivejobs_job"
            " UNION ALL SELECT id, state, attempt, false FROM hivejobs_archive ORDER BY 1",
        )
    ]


def test_the_table_holds_the_admin_routes() -> None:
    """The route table is read right: the writes the API documents are all in it."""
    assert len(ADMIN_ONLY) >= 13
    assert ("DELETE", "/v1/jobs/{name:str}/{job_id:str}") in ADMIN_ONLY
    assert ("GET", "/v1/jobs/{name:str}/{job_id:str}") not in ADMIN_ONLY
    assert ("GET", "/healthz") not in GUARDED


@pytest.mark.parametrize(("method", "path"), ADMIN_ONLY, ids=ids(ADMIN_ONLY))
def test_a_read_token_is_refused_by_every_admin_route_and_writes_nothing(
    served: tuple[TestClient[Litestar], str], database_url: str, method: str, path: str
) -> None:
    client, job_id = served
    url = concrete(path, job_id)
    before = job_rows(database_url)
    assert send(client, method, url, READER) == 403
    assert job_rows(database_url) == before
    # The admin token passes the guard on the same request (whatever the handler says then).
    assert send(client, method, url, ADMIN) not in (401, 403)


@pytest.mark.parametrize(("method", "path"), GUARDED, ids=ids(GUARDED))
def test_every_guarded_route_needs_a_token(
    served: tuple[TestClient[Litestar], str], database_url: str, method: str, path: str
) -> None:
    client, job_id = served
    url = concrete(path, job_id)
    before = job_rows(database_url)
    assert send(client, method, url, None) == 401
    assert send(client, method, url, "not-a-configured-token") == 401
    assert job_rows(database_url) == before
    if (method, path) not in ADMIN_ONLY:
        if path.endswith("/events"):
            # A stream lasts as long as its job: the test client reads a response whole, so
            # the job ends first (cancelled) and its stream ends at once.
            assert (
                send(client, "DELETE", concrete("/v1/jobs/{name:str}/{job_id:str}", job_id), ADMIN)
                == 200
            )
        assert send(client, method, url, READER) not in (401, 403)
