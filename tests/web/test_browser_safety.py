"""A web page on another origin, in a real headless Chromium, tries to drive `hivejobs serve`
through the operator's browser: a cross-site form posting JSON as text/plain, bodyless and
text/plain `fetch` writes, a read and a write through a rebound DNS name, and framing the
dashboard. With no token (open mode) and with a signed-in admin session on a same-site page
(another port of 127.0.0.1: SameSite=Strict sends the cookie), every attempt fails and
nothing is stored; the dashboard itself still works under its CSP, and signs out.

The attacker's pages come from a second HTTP server in this process. Chromium's own Local
Network Access checks are turned off: the server must not rely on one browser's guard.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.harness import free_port, sql
from tests.web.conftest import ADMIN, Server
from tests.web.test_dashboard import ARGS, CHROMIUM

pw = pytest.importorskip("playwright.sync_api")
REBIND = "rebind.test"
OPEN = {"HIVEJOBS_ADMIN_TOKENS": "", "HIVEJOBS_READ_TOKENS": ""}


class Attacker:
    """A plain HTTP server on its own port serving the attacker's pages (path -> HTML)."""

    def __init__(self) -> None:
        self.pages: dict[str, str] = {}
        pages = self.pages

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = pages.get(self.path, "no such page").encode()
                self.send_response(200 if self.path in pages else 404)
                self.send_header("content-type", "text/html; charset=utf-8")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.port = free_port()
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def attacker() -> Iterator[Attacker]:
    server = Attacker()
    yield server
    server.stop()


@pytest.fixture
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium (scripts/test does)")
    args = [
        *ARGS,
        f"--host-resolver-rules=MAP {REBIND} 127.0.0.1",
        "--disable-features=LocalNetworkAccessChecks,PrivateNetworkAccessSendPreflights,"
        "PrivateNetworkAccessRespectPreflightResults,BlockInsecurePrivateNetworkRequests",
    ]
    with pw.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=args, headless=True)
        yield b
        b.close()


def attack_page(target: str, job_id: str) -> str:
    """The form posts `{"data": {"text": "from a form="}}` as text/plain (name=value); the
    script sends no-cors writes, which need no preflight; the iframe frames the dashboard."""
    name = '{"data": {"text": "from a form'
    return f"""<!doctype html><html><body>
<form id="form" method="post" enctype="text/plain" action="{target}/v1/jobs/echo">
<input name='{name}' value='"}}}}'></form>
<iframe id="frame" src="{target}/dashboard"></iframe>
<script>
async function writes() {{
  const out = [];
  const sends = [
    ["/v1/jobtypes/echo/pause", null],
    ["/v1/jobs/echo/{job_id}/replay", null],
    ["/v1/bulk", JSON.stringify({{action: "cancel", ids: ["{job_id}"]}})],
    ["/v1/jobs/echo", JSON.stringify({{data: {{text: "from fetch"}}}})],
  ];
  for (const [path, body] of sends) {{
    try {{
      await fetch("{target}" + path, {{method: "POST", mode: "no-cors", credentials: "include",
        headers: {{"content-type": "text/plain"}}, body}});
      out.push("sent");
    }} catch (e) {{ out.push("error " + e); }}
  }}
  return out;
}}
</script></body></html>"""


REBIND_PAGE = """<!doctype html><html><body><script>
async function steal(jobId) {
  const read = await fetch("/v1/jobs/echo/" + jobId);
  const write = await fetch("/v1/jobs/echo", {method: "POST",
    headers: {"content-type": "application/json"},
    body: JSON.stringify({data: {text: "through rebinding"}})});
  return [read.status, await read.text(), write.status];
}
</script></body></html>"""


def jobs(url: str) -> int:
    return int(sql(url, "SELECT count(*) FROM hivejobs_job")[0][0])


def paused(url: str) -> int:
    return int(sql(url, "SELECT count(*) FROM hivejobs_flow WHERE paused")[0][0])


def job_state(url: str, job_id: str) -> str:
    return str(sql(url, "SELECT state FROM hivejobs_job WHERE id = %s", (job_id,))[0][0])


def run_attack(page: Any, target: str, attacker_url: str) -> list[Any]:
    """Loads the attacker's page (the frame loads with it), sends its writes and its form;
    returns the requests the page made to `target`, each finished (answered or failed: a
    no-cors answer is withheld from the page by our Cross-Origin-Resource-Policy)."""
    sent: list[Any] = []
    page.on("request", lambda r: sent.append(r) if r.url.startswith(target) else None)
    page.goto(attacker_url, wait_until="load")
    assert len(page.evaluate("writes()")) == 4
    with page.expect_response(
        lambda r: r.url == target + "/v1/jobs/echo" and "from a form" in (r.request.post_data or "")
    ) as form:
        page.evaluate("document.getElementById('form').submit()")  # fmt: skip
    assert form.value.status in (403, 415)
    # The form's answer is shown in the page: wait for that navigation to end, or the
    # caller's next goto races it (and is interrupted by it).
    page.wait_for_url(target + "/v1/jobs/echo")
    return sent


def assert_framing_refused(page: Any, target: str) -> None:
    """Called once the attacker's page has loaded, and with it its frame: the dashboard's
    response reached the browser, which shows an empty error page in its place."""
    child = next(f for f in page.frames if f.parent_frame is not None)
    assert child.url != target + "/dashboard", "the dashboard was framed"
    assert page.frame_locator("#frame").locator("nav").count() == 0, child.url


def test_a_page_on_another_site_cannot_drive_an_open_server(
    start_server: Callable[..., Server],
    attacker: Attacker,
    browser: Any,
    database_url: str,
) -> None:
    server = start_server(env=OPEN)
    job_id = server.client.post("/v1/jobs/echo", json={"data": {"text": "secret"}}).json()["id"]
    before = jobs(database_url)
    attacker.pages["/"] = attack_page(server.url, job_id)
    page = browser.new_page()
    sent = run_attack(page, server.url, f"http://localhost:{attacker.port}/")
    assert len([r for r in sent if r.method == "POST"]) == 5
    for r in sent:
        answer = r.response()
        assert answer is None or answer.status in (403, 415) or r.method == "GET", r.url
    assert jobs(database_url) == before and paused(database_url) == 0
    assert job_state(database_url, job_id) == "queued"
    page.goto(f"http://localhost:{attacker.port}/")
    assert_framing_refused(page, server.url)

    # DNS rebinding: the attacker's name first served its page, now points at 127.0.0.1; to
    # the browser the API is same-origin.
    rebound = f"http://{REBIND}:{server.port}"
    page.route(
        rebound + "/", lambda route: route.fulfill(body=REBIND_PAGE, content_type="text/html")
    )
    page.goto(rebound + "/")
    read_status, read_body, write_status = page.evaluate("id => steal(id)", job_id)
    assert (read_status, write_status) == (400, 400), read_body
    assert "secret" not in read_body and "not allowed" in read_body
    assert jobs(database_url) == before


def test_a_same_site_page_cannot_use_a_signed_in_admin_session(
    server: Server, attacker: Attacker, browser: Any, database_url: str
) -> None:
    """Another port of 127.0.0.1 is the same site: the browser sends the SameSite=Strict
    session cookie with its writes (checked), and the server refuses them all anyway."""
    job_id = server.client.post("/v1/jobs/echo", json={"data": {"text": "x"}}).json()["id"]
    before = jobs(database_url)
    context = browser.new_context()
    page = context.new_page()
    violations: list[str] = []
    page.on(
        "console", lambda m: violations.append(m.text) if "Content Security" in m.text else None
    )
    page.goto(server.url + "/dashboard/login")
    page.fill("input[name=token]", ADMIN)
    page.click("#signin")
    page.wait_for_url(server.url + "/dashboard")
    cookie = next(c for c in context.cookies() if c["name"] == "hivejobs_session")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/"
    assert cookie["value"] != ADMIN and cookie["expires"] > 0

    attacker.pages["/"] = attack_page(server.url, job_id)
    evil = context.new_page()
    sent = run_attack(evil, server.url, f"http://127.0.0.1:{attacker.port}/")
    writes = [r for r in sent if r.method == "POST"]
    assert len(writes) == 5
    for r in writes:
        answer = r.response()
        assert answer is None or answer.status in (403, 415), r.url
    # The form (its answer is shown, so its headers are known) carried the session.
    form = next(r for r in writes if "from a form" in (r.post_data or "")).all_headers()
    assert "hivejobs_session=" in form["cookie"] and form["sec-fetch-site"] == "same-site"
    assert jobs(database_url) == before and paused(database_url) == 0
    assert job_state(database_url, job_id) == "queued"
    evil.goto(f"http://127.0.0.1:{attacker.port}/")
    assert_framing_refused(evil, server.url)

    # The dashboard itself, under its CSP: its script runs (the live refresh) and its
    # buttons write; then Sign out drops the session.
    page.goto(server.url + "/dashboard/types/echo")
    with page.expect_response(lambda r: "fragment=1" in r.url and r.status == 200):
        pass
    page.click("#pause")
    page.locator("p.paused-notice").wait_for(timeout=20_000)
    assert paused(database_url) == 1
    assert violations == [], violations
    page.click("#signout")
    page.wait_for_url(server.url + "/dashboard/login")
    assert not [c for c in context.cookies() if c["name"] == "hivejobs_session"]
    page.goto(server.url + "/dashboard/workers")  # signed out: back at the sign-in form
    assert page.url == server.url + "/dashboard/login"
    assert page.locator("input[name=token]").is_visible()
