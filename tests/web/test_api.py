"""Every endpoint of the HTTP API and every error, against a real `hivejobs serve` (uvicorn in
a subprocess). No worker runs here unless a test starts one: enqueued jobs stay queued."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import httpx

from tests.harness import ROOT, Instance, RedisServer, free_port, sql, wait_until
from tests.web.conftest import ADMIN, READER, WEBAPP, Server, flow_cli


def live_count(url: str) -> int:
    return int(sql(url, "SELECT count(*) FROM hivejobs_job")[0][0])


def test_auth_read_only_and_admin_tokens(server: Server) -> None:
    anonymous = httpx.Client(base_url=server.url)
    reader = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {READER}"})
    wrong = httpx.Client(base_url=server.url, headers={"Authorization": "Bearer nope"})
    assert anonymous.get("/healthz").json() == {"status": "ok", "postgres": True, "redis": True}
    for client in (anonymous, wrong):
        r = client.get("/v1/jobtypes")
        assert r.status_code == 401
        assert "token" in r.json()["error"]
        assert r.headers["www-authenticate"].startswith("Bearer")
    assert reader.get("/v1/jobtypes").status_code == 200
    denied = reader.post("/v1/jobs/echo", json={"data": {"text": "x"}})
    assert denied.status_code == 403
    assert "read-only" in denied.json()["error"]
    assert anonymous.get("/dashboard/workers").status_code == 401
    assert server.client.post("/v1/jobs/echo", json={"data": {"text": "x"}}).status_code == 201
    # The dashboard login sets an HttpOnly SameSite=Strict cookie that then authorises.
    login = anonymous.post("/dashboard/login", data={"token": READER})
    assert login.status_code == 303
    cookie = login.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie
    assert anonymous.get("/v1/jobtypes").status_code == 200
    assert anonymous.post("/v1/jobs/echo", json={"data": {"text": "y"}}).status_code == 403
    for c in (anonymous, reader, wrong):
        c.close()


def test_put_is_idempotent_post_creates_and_bad_input_stores_nothing(
    server: Server, database_url: str
) -> None:
    c = server.client
    first = c.put("/v1/jobs/echo/order-1", json={"data": {"text": "a"}, "priority": 3})
    assert first.status_code == 201
    assert first.json()["state"] == "queued" and first.json()["priority"] == 3
    again = c.put("/v1/jobs/echo/order-1", json={"data": {"text": "a"}, "priority": 3})
    assert again.status_code == 200 and again.json()["id"] == "order-1"
    other = c.put("/v1/jobs/echo/order-1", json={"data": {"text": "b"}})
    assert other.status_code == 409 and "order-1" in other.json()["error"]
    assert c.get("/v1/jobs/echo/order-1").json()["payload"] == {"text": "a", "n": 0}
    created = c.post("/v1/jobs/echo", json={"data": {"text": "new"}, "delay": 60})
    assert created.status_code == 201 and created.json()["state"] == "scheduled"
    run_at = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    later = c.post("/v1/jobs/echo", json={"data": {"text": "later"}, "run_at": run_at})
    assert later.status_code == 201 and later.json()["state"] == "scheduled"
    stored = live_count(database_url)
    assert stored == 3

    past = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
    cases: list[tuple[str, str, bytes, int, str]] = [
        ("POST", "/v1/jobs/nope", b'{"data": {}}', 404, "unknown job type 'nope'"),
        ("PUT", "/v1/jobs/nope/x1", b'{"data": {}}', 404, "unknown job type"),
        ("POST", "/v1/jobs/echo", b'{"data": {"text": ', 400, "malformed"),
        ("POST", "/v1/jobs/echo", b'{"data": {"text": 5}}', 422, "$.text"),
        ("POST", "/v1/jobs/echo", b'{"data": {"text": "a"}, "priority": 12}', 422, "priority"),
        ("POST", "/v1/jobs/echo", b'{"data": {"text": "a"}, "delay": -1}', 422, "delay"),
        ("POST", "/v1/jobs/echo", b'{"data": {"text": "a"}, "colour": 1}', 422, "colour"),
        ("POST", "/v1/jobs/echo", b"[1, 2]", 422, "object"),
        (
            "POST",
            "/v1/jobs/echo",
            b'{"data": {"text": "a"}, "delay": 5, "run_at": "' + run_at.encode() + b'"}',
            422,
            "either delay or run_at",
        ),
        (
            "POST",
            "/v1/jobs/echo",
            b'{"data": {"text": "a"}, "expires_at": "' + past.encode() + b'"}',
            422,
            "past",
        ),
        # Over the payload limit (1 MiB), then over the body limit of the server (2 MiB).
        ("POST", "/v1/jobs/echo", b'{"data": {"text": "' + b"x" * 1_500_000 + b'"}}', 413, "limit"),
        ("POST", "/v1/jobs/echo", b'{"data": {"text": "' + b"x" * 3_000_000 + b'"}}', 413, "limit"),
        ("POST", "/v1/jobs/echo/batch", b'{"data": [{"text": "ok"}, {"text": 1}]}', 422, "$.text"),
        ("POST", "/v1/jobs/echo/batch", b'{"data": []}', 422, "data"),
        ("POST", "/v1/jobs/nope/batch", b'{"data": [{}]}', 404, "unknown job type"),
    ]
    for method, path, body, status, text in cases:
        r = c.request(method, path, content=body, headers={"content-type": "application/json"})
        assert r.status_code == status, (path, body[:80], r.text)
        assert r.json()["status"] == status
        assert text in r.json()["error"] + str(r.json().get("details")), (text, r.text)
    assert live_count(database_url) == stored  # nothing stored by any refused request
    batch = c.post("/v1/jobs/echo/batch", json={"data": [{"text": "1"}, {"text": "2"}]})
    assert batch.status_code == 201 and len(batch.json()["ids"]) == 2
    assert live_count(database_url) == stored + 2


def test_get_cancel_replay_and_lists(server: Server, database_url: str) -> None:
    c = server.client
    ids = [c.post("/v1/jobs/hold", json={"data": {}}).json()["id"] for _ in range(5)]
    assert c.get(f"/v1/jobs/hold/{ids[0]}").json()["state"] == "queued"
    assert c.get(f"/v1/jobs/echo/{ids[0]}").status_code == 404  # another type's path
    missing = c.get("/v1/jobs/hold/no-such-id")
    assert missing.status_code == 404 and "no-such-id" in missing.json()["error"]

    # Keyset pages through the queued list: every job once, in order, no OFFSET.
    seen: list[str] = []
    after = None
    while True:
        params: dict[str, str | int] = {"state": "queued", "type": "hold", "limit": 2}
        page = c.get("/v1/jobs", params={**params, **({"after": after} if after else {})})
        assert page.status_code == 200
        seen += [j["id"] for j in page.json()["jobs"]]
        after = page.json()["next"]
        if after is None:
            break
    assert seen == ids
    assert c.get("/v1/jobs", params={"state": "nope"}).status_code == 422

    cancel = c.delete(f"/v1/jobs/hold/{ids[0]}")
    assert cancel.json() == {"id": ids[0], "outcome": "cancelled"}
    assert c.get(f"/v1/jobs/hold/{ids[0]}").json()["state"] == "cancelled"
    assert c.delete(f"/v1/jobs/hold/{ids[0]}").json()["outcome"] == "already_cancelled"
    not_finished = c.post(f"/v1/jobs/hold/{ids[1]}/replay")
    assert not_finished.status_code == 409 and "queued" in not_finished.json()["error"]
    replay = c.post(f"/v1/jobs/hold/{ids[0]}/replay")
    assert replay.status_code == 201 and replay.json()["state"] == "queued"
    assert replay.json()["id"] != ids[0]
    sql(
        database_url,
        "WITH d AS (DELETE FROM hivejobs_job WHERE id = %s RETURNING *) "
        "INSERT INTO hivejobs_archive (id, name, state, priority, attempt, attempts, delivery,"
        " payload, created_at, run_at, error) SELECT id, name, 'failed', priority, 1, attempts,"
        " delivery, payload, created_at, run_at, 'Traceback: boom' FROM d",
        (ids[1],),
    )
    finished = c.delete(f"/v1/jobs/hold/{ids[1]}")
    assert finished.status_code == 409 and "already ended failed" in finished.json()["error"]
    failed = c.get("/v1/jobs", params={"state": "failed"}).json()["jobs"]
    assert [j["id"] for j in failed] == [ids[1]]
    bulk = c.post("/v1/bulk", json={"action": "cancel", "ids": [ids[2], ids[3], "nope"]})
    assert [r["ok"] for r in bulk.json()["results"]] == [True, True, False]
    assert c.post("/v1/bulk", json={"action": "explode", "ids": ["x"]}).status_code == 422
    replayed = c.post("/v1/bulk", json={"action": "replay", "ids": [ids[1]]}).json()
    assert replayed["results"][0]["ok"] and replayed["results"][0]["new_id"]
    finished_page = c.get("/v1/jobs", params={"state": "finished", "limit": 500}).json()["jobs"]
    assert {ids[0], ids[1], ids[2], ids[3]} <= {j["id"] for j in finished_page}


def test_chains_jobtypes_workers_metrics_schema(server: Server) -> None:
    c = server.client
    chain = {
        "name": "pipeline",
        "jobs": [
            {"key": "fetch", "type": "echo", "payload": {"text": "f"}},
            {"key": "store", "type": "echo", "payload": {"text": "s"}, "after": ["fetch"]},
        ],
    }
    made = c.post("/v1/chains", json=chain)
    assert made.status_code == 201
    chain_id = made.json()["id"]
    got = c.get(f"/v1/chains/{chain_id}").json()
    assert got["name"] == "pipeline" and [j["key"] for j in got["jobs"]] == ["fetch", "store"]
    assert got["log"] == []
    assert c.get("/v1/chains").json()["chains"][0]["id"] == chain_id
    cyclic = {
        "name": "loop",
        "jobs": [
            {"key": "a", "type": "echo", "after": ["b"]},
            {"key": "b", "type": "echo", "after": ["a"]},
        ],
    }
    refused = c.post("/v1/chains", json=cyclic)
    assert refused.status_code == 422 and "cycle" in refused.json()["error"]
    unknown = {"name": "u", "jobs": [{"key": "a", "type": "nope"}]}
    assert c.post("/v1/chains", json=unknown).status_code == 422
    assert c.post("/v1/chains", json={"name": "x"}).status_code == 422
    assert c.get("/v1/chains/nope").status_code == 404
    assert c.post("/v1/chains/nope/stop").status_code == 404
    assert c.post(f"/v1/chains/{chain_id}/stop").json() == {
        "id": chain_id,
        "stop_requested": True,
    }
    types = {t["name"]: t for t in c.get("/v1/jobtypes").json()}
    assert set(types) == {"echo", "boom", "hold", "remote"}
    assert types["remote"]["callback"] and not types["echo"]["callback"]
    assert c.get("/v1/workers").json() == {"workers": [], "leader": None}
    assert c.get("/v1/throughput", params={"minutes": 5}).json()["minutes"][-1] > 0
    metrics = c.get("/metrics")
    assert metrics.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert "# TYPE hivejobs_jobs_succeeded_total counter" in metrics.text
    assert 'hivejobs_up{backend="postgres"} 1' in metrics.text
    spec = c.get("/schema/openapi.json").json()
    assert {"/v1/jobs/{name}/{job_id}", "/v1/chains", "/metrics"} <= set(spec["paths"])
    assert c.get("/v1/nothing-here").status_code == 404


def test_schema_shows_record_states_as_plain_strings(server: Server) -> None:
    """The responses built on records' generic fields (web/schemas.py) keep their types in
    the schema: a state is a plain string (no enum), and no field falls back to `object`."""
    schemas = server.client.get("/schema/openapi.json").json()["components"]["schemas"]
    for name in ("JobOut", "ChainOut", "ChainJobOut", "JobLogOut", "ChainListItem"):
        assert schemas[name]["properties"]["state"] == {"type": "string"}, name
    assert schemas["JobOut"]["properties"]["delivery"] == {"type": "string"}
    jobs = schemas["ChainOut"]["properties"]["jobs"]
    assert jobs["items"] == {"$ref": "#/components/schemas/ChainJobOut"}


def test_jobtypes_show_which_types_are_paused(server: Server, web_env: dict[str, str]) -> None:
    c = server.client
    assert flow_cli(web_env, "pause", "echo") == "paused"
    types = {t["name"]: t for t in c.get("/v1/jobtypes").json()}
    assert types["echo"]["paused"] is True
    paused_at = datetime.fromisoformat(types["echo"]["paused_at"])
    assert abs(datetime.now(UTC) - paused_at) < timedelta(minutes=5)
    assert (types["boom"]["paused"], types["boom"]["paused_at"]) == (False, None)
    assert flow_cli(web_env, "resume", "echo") == "resumed"
    echo = {t["name"]: t for t in c.get("/v1/jobtypes").json()}["echo"]
    assert (echo["paused"], echo["paused_at"]) == (False, None)
    schema = c.get("/schema/openapi.json").json()["components"]["schemas"]
    assert {"paused", "paused_at"} <= set(schema["JobTypeOut"]["properties"])


def test_stop_of_a_finished_chain_is_409(
    server: Server, fleet: Callable[..., Instance], database_url: str
) -> None:
    fleet()
    c = server.client
    chain = {"name": "one", "jobs": [{"key": "a", "type": "echo", "payload": {"text": "a"}}]}
    chain_id = c.post("/v1/chains", json=chain).json()["id"]
    wait_until(
        lambda: c.get(f"/v1/chains/{chain_id}").json()["state"] == "succeeded",
        what="the chain to succeed",
    )
    log = c.get(f"/v1/chains/{chain_id}").json()["log"]
    assert [(e["key"], e["state"]) for e in log] == [("a", "succeeded")]
    again = c.post(f"/v1/chains/{chain_id}/stop")
    assert again.status_code == 409 and "already ended succeeded" in again.json()["error"]
    job = c.post("/v1/jobs/echo", json={"data": {"text": "done"}}).json()["id"]
    wait_until(lambda: c.get(f"/v1/jobs/echo/{job}").json()["state"] == "succeeded")
    assert c.get(f"/v1/jobs/echo/{job}").json()["result"] == {"echo": "done"}
    workers = c.get("/v1/workers").json()
    assert {w["role"] for w in workers["workers"]} == {"pool", "coordinator"}
    assert workers["leader"]["valid"]


def test_without_tokens_only_loopback(web_env: dict[str, str], tmp_path: object) -> None:
    env = {k: v for k, v in web_env.items() if not k.endswith("_TOKENS")}
    refused = subprocess.run(
        [sys.executable, "-m", "hivejobs", "serve", WEBAPP, "--host", "0.0.0.0"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2
    assert "refusing to listen on 0.0.0.0" in refused.stderr
    assert "HIVEJOBS_ADMIN_TOKENS" in refused.stderr
    port = free_port()
    open_server = subprocess.Popen(
        [sys.executable, "-m", "hivejobs", "serve", WEBAPP, "--port", str(port)],
        cwd=ROOT,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"

        def up() -> bool:
            try:
                return httpx.get(url + "/healthz").status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(up, what="open server")
        assert httpx.post(url + "/v1/jobs/echo", json={"data": {"text": "x"}}).status_code == 201
    finally:
        open_server.terminate()
        _, err = open_server.communicate(timeout=10)
    assert err.count("no token configured") == 1 and "every loopback client is admin" in err


def test_mounted_in_a_host_asgi_app(web_env: dict[str, str], tmp_path: object) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "tests.apps.mounted:asgi", "--port", str(port)],
        cwd=ROOT,
        env=web_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        auth = {"Authorization": f"Bearer {ADMIN}"}

        def up() -> bool:
            try:
                return httpx.get(url + "/hello").status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(up, what="host app")
        made = httpx.post(url + "/jobs/v1/jobs/echo", json={"data": {"text": "m"}}, headers=auth)
        assert made.status_code == 201
        page = httpx.get(url + "/jobs/dashboard", headers=auth)
        assert page.status_code == 200
        assert 'href="/jobs/dashboard/failed"' in page.text  # links know the mount point
        assert httpx.get(url + "/jobs/v1/jobtypes").status_code == 401  # still protected
    finally:
        proc.terminate()
        proc.wait(10)


def test_backend_down_is_503_not_500(
    start_server: Callable[..., Server], own_redis: RedisServer
) -> None:
    server = start_server(env={"HIVEJOBS_REDIS_URL": own_redis.url})
    c = server.client
    assert c.get("/healthz").json()["redis"] is True
    own_redis.stop()
    # /healthz reuses its answer for probe_cache_s: it turns within that interval.
    wait_until(lambda: c.get("/healthz").status_code == 503, what="/healthz to see Redis down")
    health = c.get("/healthz")
    assert health.json() == {"status": "degraded", "postgres": True, "redis": False}
    down = c.get("/v1/throughput")
    assert down.status_code == 503 and down.json()["error"] == "Redis does not answer; retry later"
    # Postgres is the truth: an enqueue is acknowledged; the reconciler pushes it later.
    assert c.post("/v1/jobs/echo", json={"data": {"text": "x"}}).status_code == 201
    assert "request failed unexpectedly" not in server.log_path.read_text()
