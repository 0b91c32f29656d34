"""Flow control over HTTP: pause, resume and scale a job type against a real
`hivejobs serve`, with its state read back from Postgres, and a real `hivejobs run` fleet that
starts nothing of a type paused over HTTP until it is resumed."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from tests.harness import Instance, pool_pids, sql, wait_until
from tests.web.conftest import READER, Server, flow_cli

FLOW_ROW = "SELECT paused, paused_at, concurrency FROM hivejobs_flow WHERE name = %s"


def flow_row(url: str, name: str) -> tuple[Any, ...] | None:
    rows = sql(url, FLOW_ROW, (name,))
    return rows[0] if rows else None


def test_pause_resume_and_scale_a_type_over_http(
    server: Server, database_url: str, web_env: dict[str, str]
) -> None:
    c = server.client
    base = "/v1/jobtypes/echo"
    assert c.get(base + "/flow").json() == {
        "name": "echo",
        "paused": False,
        "paused_at": None,
        "concurrency": 4,
        "scaled_concurrency": None,
    }

    paused = c.post(base + "/pause")
    assert paused.status_code == 200, paused.text
    body = paused.json()
    assert (body["name"], body["paused"], body["changed"]) == ("echo", True, True)
    paused_at = datetime.fromisoformat(body["paused_at"])
    assert abs(datetime.now(UTC) - paused_at) < timedelta(minutes=5)
    assert flow_row(database_url, "echo") == (True, paused_at, None)
    # The same state the CLI and the fleet views read; a second pause changes nothing.
    assert flow_cli(web_env, "pause") == "echo"
    assert {t["name"]: t["paused"] for t in c.get("/v1/jobtypes").json()}["echo"] is True
    again = c.post(base + "/pause").json()
    assert (again["changed"], again["paused_at"]) == (False, body["paused_at"])
    assert c.get(base + "/flow").json()["paused"] is True

    resumed = c.post(base + "/resume").json()
    assert (resumed["paused"], resumed["paused_at"], resumed["changed"]) == (False, None, True)
    assert c.post(base + "/resume").json()["changed"] is False
    assert flow_row(database_url, "echo") == (False, None, None)

    scaled = c.put(base + "/concurrency", json={"concurrency": 9})
    assert scaled.status_code == 200, scaled.text
    assert (scaled.json()["concurrency"], scaled.json()["scaled_concurrency"]) == (4, 9)
    assert flow_row(database_url, "echo") == (False, None, 9)

    # Bad concurrency: 422 (400 for malformed JSON) naming the field, and nothing stored.
    for raw, status, text in [
        (b'{"concurrency": 0}', 422, "concurrency"),
        (b'{"concurrency": 1001}', 422, "concurrency"),
        (b'{"concurrency": -3}', 422, "concurrency"),
        # Litestar decodes bodies leniently (a numeric string is a number, as for every
        # field of the API): "12" would be 12, but not a word nor an out-of-range string.
        (b'{"concurrency": "twelve"}', 422, "concurrency"),
        (b'{"concurrency": "0"}', 422, "concurrency"),
        (b'{"concurrency": 2.5}', 422, "concurrency"),
        (b'{"concurrency": true}', 422, "concurrency"),
        (b'{"concurrency": null}', 422, "concurrency"),
        (b"{}", 422, "concurrency"),
        (b'{"concurrency": 3, "processes": 2}', 422, "processes"),
        (b'{"concurrency": ', 400, "malformed"),
    ]:
        r = c.put(base + "/concurrency", content=raw, headers={"content-type": "application/json"})
        assert r.status_code == status, (raw, r.text)
        assert r.json()["status"] == status
        assert text in r.json()["error"] + str(r.json().get("details")), (raw, r.text)
    assert flow_row(database_url, "echo") == (False, None, 9)

    back = c.delete(base + "/concurrency")
    assert back.status_code == 200, back.text
    assert (back.json()["concurrency"], back.json()["scaled_concurrency"]) == (4, None)
    assert flow_row(database_url, "echo") == (False, None, None)

    # An unknown type: 404 naming it, from every route, and no flow row made for it.
    for method, path in [
        ("GET", "/v1/jobtypes/nope/flow"),
        ("POST", "/v1/jobtypes/nope/pause"),
        ("POST", "/v1/jobtypes/nope/resume"),
        ("PUT", "/v1/jobtypes/nope/concurrency"),
        ("DELETE", "/v1/jobtypes/nope/concurrency"),
    ]:
        body_kw: dict[str, Any] = {"json": {"concurrency": 2}} if method == "PUT" else {}
        r = c.request(method, path, **body_kw)
        assert r.status_code == 404, (method, path, r.text)
        assert "unknown job type 'nope'" in r.json()["error"]
    assert flow_row(database_url, "nope") is None


def test_flow_writes_need_an_admin_token(server: Server, database_url: str) -> None:
    anonymous = httpx.Client(base_url=server.url)
    reader = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {READER}"})
    writes: list[tuple[str, str, dict[str, Any]]] = [
        ("POST", "/v1/jobtypes/echo/pause", {}),
        ("POST", "/v1/jobtypes/echo/resume", {}),
        ("PUT", "/v1/jobtypes/echo/concurrency", {"json": {"concurrency": 2}}),
        ("DELETE", "/v1/jobtypes/echo/concurrency", {}),
    ]
    for method, path, kw in writes:
        r = anonymous.request(method, path, **kw)
        assert r.status_code == 401, (method, path, r.text)
        assert r.headers["www-authenticate"].startswith("Bearer")
        r = reader.request(method, path, **kw)
        assert r.status_code == 403, (method, path, r.text)
        assert "read-only" in r.json()["error"]
    assert anonymous.get("/v1/jobtypes/echo/flow").status_code == 401
    assert reader.get("/v1/jobtypes/echo/flow").json()["paused"] is False
    assert flow_row(database_url, "echo") is None  # nothing written by a refused request
    for client in (anonymous, reader):
        client.close()


def test_a_type_paused_over_http_starts_nothing_until_resumed(
    server: Server, fleet: Callable[..., Instance], database_url: str
) -> None:
    inst = fleet({"HIVEJOBS_LOG_LEVEL": "INFO"})  # for the pool's "concurrency scaled" line
    wait_until(lambda: pool_pids(database_url, "echo"), what="the echo pool")
    c = server.client
    assert c.post("/v1/jobtypes/echo/pause").json()["paused"] is True
    ids = [c.post("/v1/jobs/echo", json={"data": {"text": str(i)}}).json()["id"] for i in range(8)]
    # The pool reads pause and scale in one query: once it follows this scale, it has seen
    # the pause too, after the jobs were enqueued; and the claim itself checks the pause.
    assert c.put("/v1/jobtypes/echo/concurrency", json={"concurrency": 3}).status_code == 200
    wait_until(
        lambda: "concurrency scaled" in inst.log_text(), timeout=20, what="the pool to scale"
    )
    # Another type runs meanwhile: the fleet works, only the paused type waits.
    boom = c.post("/v1/jobs/boom", json={"data": {}}).json()["id"]
    wait_until(lambda: c.get(f"/v1/jobs/boom/{boom}").json()["state"] == "failed", what="boom")
    held = [c.get(f"/v1/jobs/echo/{i}").json() for i in ids]
    assert {(j["state"], j["attempt"]) for j in held} == {("queued", 0)}

    assert c.post("/v1/jobtypes/echo/resume").json()["changed"] is True
    wait_until(
        lambda: all(c.get(f"/v1/jobs/echo/{i}").json()["state"] == "succeeded" for i in ids),
        timeout=30,
        what="the echo jobs to run after the resume",
    )
    done = [c.get(f"/v1/jobs/echo/{i}").json() for i in ids]
    assert [(j["attempt"], j["result"]) for j in done] == [(1, {"echo": str(i)}) for i in range(8)]
