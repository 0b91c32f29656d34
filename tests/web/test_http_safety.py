"""What a web page, a guesser or a careless embedding could do to `hivejobs serve`, sent as
raw HTTP to a real server (tests/web/test_browser_safety.py sends the same from a real
Chromium): a foreign Host, a cross-site write, a body that is not JSON, a short token, a
flood of wrong tokens, a forged or stale session cookie, an open create_app. Each is refused
and stores nothing; every response carries the security headers."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable

import httpx
import pytest

from tests.harness import ROOT, free_port, sql, wait_until
from tests.web.conftest import ADMIN, READER, WEBAPP, Server

OPEN = {"HIVEJOBS_ADMIN_TOKENS": "", "HIVEJOBS_READ_TOKENS": ""}
SECURITY_HEADERS = {
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
}


def stored(url: str) -> int:
    return int(sql(url, "SELECT count(*) FROM hivejobs_job")[0][0])


def paused(url: str) -> int:
    return int(sql(url, "SELECT count(*) FROM hivejobs_flow WHERE paused")[0][0])


def test_open_mode_refuses_what_a_web_page_can_send(
    start_server: Callable[..., Server], database_url: str
) -> None:
    """No token: a form's text/plain JSON, a bodyless write from another site, a read through
    a rebound name are refused; the same requests from curl or the dashboard itself pass."""
    server = start_server(env=OPEN)
    anyone = httpx.Client(base_url=server.url, timeout=10)
    body = json.dumps({"data": {"text": "from a form"}})
    job = anyone.post("/v1/jobs/echo", json={"data": {"text": "curl"}})
    assert job.status_code == 201  # no page involved: curl and scripts stay admin locally
    job_id = job.json()["id"]
    before = stored(database_url)

    for content_type in ("text/plain", "application/x-www-form-urlencoded", None):
        headers = {"content-type": content_type} if content_type else {}
        r = anyone.post("/v1/jobs/echo", content=body, headers=headers)
        assert r.status_code == 415, (content_type, r.text)
        assert "application/json" in r.json()["error"]
    bulk = {"action": "cancel", "ids": [job_id]}
    for page in (
        {"origin": "http://evil.example"},
        {"origin": "null"},
        {"sec-fetch-site": "cross-site", "origin": "http://evil.example"},
        {"sec-fetch-site": "same-site", "origin": f"http://localhost:{server.port}"},
    ):
        for path in ("/v1/jobtypes/echo/pause", f"/v1/jobs/echo/{job_id}/replay"):
            r = anyone.post(path, headers=page)
            assert r.status_code == 403 and "cross-site" in r.json()["error"], (page, r.text)
        assert anyone.post("/v1/bulk", json=bulk, headers=page).status_code == 403
        assert anyone.delete(f"/v1/jobs/echo/{job_id}", headers=page).status_code == 403
    assert stored(database_url) == before and paused(database_url) == 0
    assert anyone.get(f"/v1/jobs/echo/{job_id}").json()["state"] == "queued"

    # DNS rebinding: the page's own name now points at 127.0.0.1, so the browser calls it
    # same-origin; only the Host header tells.
    for host in (f"rebind.example:{server.port}", "evil.example", f"192.0.2.9:{server.port}"):
        r = anyone.get(f"/v1/jobs/echo/{job_id}", headers={"host": host})
        assert r.status_code == 400 and "not allowed" in r.json()["error"], host
        assert "curl" not in r.text
        rebound = {"host": host, "sec-fetch-site": "same-origin"}
        assert anyone.post("/v1/jobs/echo", json={"data": {}}, headers=rebound).status_code == 400
    assert stored(database_url) == before

    # The dashboard's own calls: same origin, JSON; and the loopback names.
    own = {"origin": server.url, "sec-fetch-site": "same-origin"}
    assert anyone.post("/v1/jobs/echo", json={"data": {"text": "own"}}, headers=own).is_success
    for host in (f"localhost:{server.port}", f"[::1]:{server.port}", "app.localhost"):
        assert anyone.get("/v1/jobtypes", headers={"host": host}).status_code == 200, host
    anyone.close()


def test_allowed_hosts_are_configurable(
    start_server: Callable[..., Server], database_url: str
) -> None:
    server = start_server(env={**OPEN, "HIVEJOBS_ALLOWED_HOSTS": "jobs.internal, .corp.example"})
    c = httpx.Client(base_url=server.url, timeout=10)
    for host in ("jobs.internal", "jobs.internal:8080", "a.corp.example", "corp.example"):
        assert c.get("/v1/jobtypes", headers={"host": host}).status_code == 200, host
    for host in ("other.internal", "evilcorp.example", "corp.example.evil"):
        assert c.get("/v1/jobtypes", headers={"host": host}).status_code == 400, host
    c.close()
    # With tokens the Host is checked only when names are configured.
    tokens = start_server()
    assert tokens.client.get("/v1/jobtypes", headers={"host": "any.name"}).status_code == 200
    fenced = start_server(env={"HIVEJOBS_ALLOWED_HOSTS": "jobs.internal"})
    assert fenced.client.get("/v1/jobtypes", headers={"host": "any.name"}).status_code == 400
    assert fenced.client.get("/v1/jobtypes", headers={"host": "jobs.internal"}).is_success


def test_token_mode_refuses_cross_site_writes_even_with_a_session(
    server: Server, database_url: str
) -> None:
    """A sibling subdomain is same-site, so SameSite=Strict sends the cookie: the same-origin
    rule refuses the write anyway, and a text/plain body is refused before any token."""
    browser = httpx.Client(base_url=server.url, timeout=10)
    signed = browser.post("/dashboard/login", data={"token": ADMIN})
    assert signed.status_code == 303
    before = stored(database_url)
    sibling = {"origin": "http://www.jobs.example", "sec-fetch-site": "same-site"}
    r = browser.post("/v1/jobs/echo", json={"data": {"text": "x"}}, headers=sibling)
    assert r.status_code == 403 and "cross-site" in r.json()["error"]
    plain = browser.post(
        "/v1/jobs/echo", content='{"data": {}}', headers={"content-type": "text/plain"}
    )
    assert plain.status_code == 415
    assert browser.post("/v1/jobtypes/echo/pause", headers=sibling).status_code == 403
    assert stored(database_url) == before and paused(database_url) == 0
    own = {"origin": server.url, "sec-fetch-site": "same-origin"}
    assert browser.post("/v1/jobs/echo", json={"data": {"text": "x"}}, headers=own).is_success
    # The login form itself: a cross-site page cannot sign the browser in (login CSRF).
    forged = httpx.post(
        server.url + "/dashboard/login", data={"token": READER}, headers=sibling, timeout=10
    )
    assert forged.status_code == 403 and "set-cookie" not in forged.headers
    browser.close()


def test_session_cookie_is_signed_expiring_scoped_and_dropped_at_logout(
    start_server: Callable[..., Server],
) -> None:
    server = start_server()
    browser = httpx.Client(base_url=server.url, timeout=10)
    login = browser.post("/dashboard/login", data={"token": ADMIN})
    cookie = login.headers["set-cookie"]
    attributes = {p.strip().split("=")[0].lower() for p in cookie.split(";")}
    assert cookie.startswith("hivejobs_session=")
    assert {"httponly", "max-age", "path"} <= attributes
    assert "samesite=strict" in cookie.lower() and "path=/;" in cookie.lower() + ";"
    assert "max-age=43200" in cookie.lower()
    session = browser.cookies["hivejobs_session"]
    assert ADMIN not in session and ADMIN not in cookie
    assert browser.get("/v1/jobtypes").status_code == 200
    # Forged: the role changed, or the MAC; another server's session (its own secret).
    role, expires, nonce, mac = session.split(".")
    for forged in (
        f"admin.{int(expires) + 10**6}.{nonce}.{mac}",
        f"{role}.{expires}.{nonce}.{'0' * len(mac)}",
        ADMIN,
    ):
        r = httpx.get(server.url + "/v1/jobtypes", cookies={"hivejobs_session": forged})
        assert r.status_code == 401, forged
    other = start_server()
    assert (
        httpx.get(other.url + "/v1/jobtypes", cookies={"hivejobs_session": session}).status_code
        == 401
    )
    read = httpx.Client(base_url=server.url, timeout=10)
    read.post("/dashboard/login", data={"token": READER})
    assert read.get("/v1/jobtypes").status_code == 200
    assert read.post("/v1/jobs/echo", json={"data": {"text": "x"}}).status_code == 403
    out = browser.post("/dashboard/logout")
    assert out.status_code == 303 and "max-age=0" in out.headers["set-cookie"].lower()
    assert "hivejobs_session" not in browser.cookies
    assert browser.get("/v1/jobtypes").status_code == 401
    browser.close()
    read.close()


def test_session_cookie_path_is_the_mount_point(web_env: dict[str, str]) -> None:
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
        wait_until(lambda: _answers(url + "/hello"), what="host app")
        login = httpx.post(url + "/jobs/dashboard/login", data={"token": ADMIN})
        assert login.status_code == 303 and login.headers["location"] == "/jobs/dashboard"
        assert "path=/jobs;" in login.headers["set-cookie"].lower() + ";"
    finally:
        proc.terminate()
        proc.wait(10)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url).status_code == 200
    except httpx.HTTPError:
        return False


def test_short_tokens_are_refused_naming_the_variable(web_env: dict[str, str]) -> None:
    for name, value in (
        ("HIVEJOBS_ADMIN_TOKENS", "a"),
        ("HIVEJOBS_READ_TOKENS", "look-only"),
        ("HIVEJOBS_ADMIN_TOKENS", f"{ADMIN},s3cret"),
    ):
        refused = subprocess.run(
            [sys.executable, "-m", "hivejobs", "serve", WEBAPP, "--host", "0.0.0.0"],
            cwd=ROOT,
            env={**web_env, name: value},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert refused.returncode == 2, refused.stderr
        assert name in refused.stderr and "at least 20" in refused.stderr
        assert "token_urlsafe" in refused.stderr
        assert "s3cret" not in refused.stderr and "look-only" not in refused.stderr


def test_wrong_tokens_are_logged_and_back_off_per_client(
    start_server: Callable[..., Server],
) -> None:
    server = start_server(env={"HIVEJOBS_LOG_FORMAT": "json"})
    guess = "wrong-guess-0123456789abcdef"
    guesser = httpx.Client(
        base_url=server.url, headers={"Authorization": f"Bearer {guess}"}, timeout=10
    )
    codes = [guesser.get("/v1/jobtypes").status_code for _ in range(10)]
    assert codes == [401] * 10
    blocked = guesser.get("/v1/jobtypes")
    assert blocked.status_code == 429 and 0 < int(blocked.headers["retry-after"]) <= 60
    assert "too many wrong tokens" in blocked.json()["error"]
    # Blocked: even the right token from there is not compared, nor a login.
    right = {"Authorization": f"Bearer {ADMIN}"}
    assert guesser.get("/v1/jobtypes", headers=right).status_code == 429
    assert guesser.post("/dashboard/login", data={"token": ADMIN}).status_code == 429
    for _ in range(20):
        assert guesser.get("/v1/jobtypes").status_code == 429
    # Another client address (127.0.0.2 is loopback too) is not blocked.
    elsewhere = httpx.Client(
        base_url=server.url,
        headers=right,
        transport=httpx.HTTPTransport(local_address="127.0.0.2"),
        timeout=10,
    )
    assert elsewhere.get("/v1/jobtypes").status_code == 200
    elsewhere.close()
    guesser.close()
    server.stop()
    lines = [json.loads(x) for x in server.log_path.read_text().splitlines() if x.startswith("{")]
    failed = [r["record"] for r in lines if "authentication failed" in r["record"]["message"]]
    assert len(failed) == 10  # bounded: the blocked requests are not logged
    assert {r["extra"]["client"] for r in failed} == {"127.0.0.1"}
    assert {r["extra"]["path"] for r in failed} == {"/v1/jobtypes"}
    assert any("client blocked" in r["record"]["message"] for r in lines)
    assert guess not in server.log_path.read_text() and ADMIN not in server.log_path.read_text()


def test_create_app_without_tokens_needs_allow_open(web_env: dict[str, str]) -> None:
    code = "from hivejobs.web import create_app; from {m} import app; create_app(app{extra})"
    refused = subprocess.run(
        [sys.executable, "-c", code.format(m="tests.apps.webapp", extra="")],
        cwd=ROOT,
        env=web_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode != 0
    assert "allow_open=True" in refused.stderr and "ConfigError" in refused.stderr
    short = code.format(m="tests.apps.webapp", extra=", admin_tokens=['s3cret']")
    refused = subprocess.run(
        [sys.executable, "-c", short], cwd=ROOT, env=web_env, capture_output=True, text=True
    )
    assert "admin_tokens" in refused.stderr and "at least 20" in refused.stderr


def test_open_create_app_serves_loopback_clients_only(web_env: dict[str, str]) -> None:
    """Embedded with allow_open=True on a host app that listens everywhere: a client from
    the network is refused, a local one is admin."""
    outside = _non_loopback_address()
    if outside is None:
        pytest.skip("this machine has no non-loopback address to connect from")
    port = free_port()
    script = (
        "import uvicorn; from hivejobs.web import create_app; from tests.apps.webapp import app; "
        f"uvicorn.run(create_app(app, allow_open=True), host='0.0.0.0', port={port})"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=web_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(lambda: _answers(f"http://127.0.0.1:{port}/healthz"), what="open app")
        remote = httpx.get(f"http://{outside}:{port}/v1/jobtypes", headers={"host": "localhost"})
        assert remote.status_code == 403 and "loopback" in remote.json()["error"]
        assert httpx.get(f"http://127.0.0.1:{port}/v1/jobtypes").status_code == 200
    finally:
        proc.terminate()
        proc.wait(10)


def _non_loopback_address() -> str | None:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: picks the outgoing address
        except OSError:
            return None
        address = str(s.getsockname()[0])
    return None if address.startswith("127.") else address


def test_security_headers_on_every_response_and_no_cdn_scripts(server: Server) -> None:
    anonymous = httpx.Client(base_url=server.url, timeout=10)
    responses = [
        anonymous.get("/healthz"),
        anonymous.get("/v1/jobtypes"),  # 401
        anonymous.get("/dashboard/login"),
        anonymous.get("/no-such-page"),  # 404 from the router
        anonymous.post("/v1/jobs/echo", content="x", headers={"content-type": "text/plain"}),
        server.client.get("/dashboard"),
        server.client.get("/v1/jobtypes"),
        server.client.get("/schema/openapi.json"),
        server.client.get("/metrics"),
    ]
    for r in responses:
        for name, value in SECURITY_HEADERS.items():
            assert r.headers.get(name) == value, (r.url, r.status_code, name)
        csp = r.headers["content-security-policy"]
        assert "frame-ancestors 'none'" in csp and "default-src 'none'" in csp
        assert "unsafe-inline" not in csp.split("script-src")[1].split(";")[0]
    for path in ("/schema/openapi.json", "/schema", "/", "/dashboard"):
        assert anonymous.get(path).status_code == 401, path  # public: /healthz, the login
    # The Swagger UI loaded its scripts from a CDN on the admin origin: the spec only now.
    assert server.client.get("/schema/swagger").status_code == 404
    for path in ("/schema", "/schema/openapi.json", "/dashboard"):
        text = server.client.get(path).text
        assert "cdn." not in text and "<script src" not in text, path
    anonymous.close()


def test_login_form_wrong_token_is_counted(start_server: Callable[..., Server]) -> None:
    server = start_server()
    form = httpx.Client(base_url=server.url, timeout=10)
    for _ in range(10):
        r = form.post("/dashboard/login", data={"token": "not-the-token-at-all-123"})
        assert r.status_code == 303 and r.headers["location"] == "/dashboard/login"
        assert "set-cookie" not in r.headers
    assert form.post("/dashboard/login", data={"token": ADMIN}).status_code == 429
    form.close()
