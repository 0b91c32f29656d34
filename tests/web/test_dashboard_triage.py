"""Triage from the dashboard in a real headless Chromium: the failed-jobs page says what went
wrong (the exception line, not the head of the traceback), and the API gives that line as its
own field."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.harness import Instance, wait_until
from tests.web.conftest import ADMIN, Server

pw = pytest.importorskip("playwright.sync_api")
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]
BOOM_LINE = "RuntimeError: boom: the handler failed on purpose"


@pytest.fixture
def browser() -> Iterator[object]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium (scripts/test does)")
    with pw.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield b
        b.close()


def sign_in(page: object, base: str) -> None:
    page.goto(base + "/dashboard/login")  # type: ignore[attr-defined]
    page.fill("input[name=token]", ADMIN)  # type: ignore[attr-defined]
    page.click("#signin")  # type: ignore[attr-defined]
    page.wait_for_url(base + "/dashboard")  # type: ignore[attr-defined]


def test_failed_jobs_page_shows_the_exception_line(
    server: Server, fleet: Callable[..., Instance], browser: object
) -> None:
    fleet()
    c = server.client
    job_id = c.post("/v1/jobs/boom", json={"data": {}}).json()["id"]
    wait_until(lambda: c.get(f"/v1/jobs/boom/{job_id}").json()["state"] == "failed")

    listed = c.get("/v1/jobs", params={"state": "failed"}).json()["jobs"]
    assert [j["error_line"] for j in listed] == [BOOM_LINE]
    assert listed[0]["error"].startswith("Traceback")  # the head stays where it was

    page = browser.new_page()  # type: ignore[attr-defined]
    sign_in(page, server.url)
    page.goto(server.url + "/dashboard/failed")
    row = page.locator("tr", has_text=job_id)
    assert row.locator(".error-line").inner_text() == BOOM_LINE


def test_a_browser_without_a_session_lands_on_the_sign_in_page(
    server: Server, browser: object
) -> None:
    page = browser.new_page()  # type: ignore[attr-defined]
    for path in ("/", "/dashboard", "/dashboard/failed"):
        page.goto(server.url + path)
        assert page.url == server.url + "/dashboard/login", path
        assert page.locator("input[name=token]").is_visible()
    # An API client (no HTML asked for) keeps the JSON 401 that says what to send.
    denied = httpx.get(server.url + "/dashboard/failed", headers={"Accept": "*/*"})
    assert denied.status_code == 401
    assert "Bearer" in denied.json()["error"]
    sign_in(page, server.url)
    page.goto(server.url + "/dashboard/failed")
    assert page.url == server.url + "/dashboard/failed"


def test_chain_page_shows_the_tracebacks_lines_from_the_handler(
    server: Server, fleet: Callable[..., Instance], browser: object
) -> None:
    fleet()
    c = server.client
    chain = {"name": "etl", "jobs": [{"key": "transform", "type": "boom", "payload": {}}]}
    chain_id = c.post("/v1/chains", json=chain).json()["id"]
    wait_until(lambda: c.get(f"/v1/chains/{chain_id}").json()["state"] == "failed")

    page = browser.new_page()  # type: ignore[attr-defined]
    sign_in(page, server.url)
    page.goto(f"{server.url}/dashboard/chains/{chain_id}")
    text = page.locator("pre.error").first.inner_text()
    lines = text.splitlines()
    assert lines[0] == "Traceback (most recent call last):"
    assert lines[1].strip().endswith("frames of the worker calling the handler]")
    assert "tests/apps/webapp.py" in lines[2]  # the handler's frame comes first
    assert lines[-1] == BOOM_LINE
    assert "hivejobs/worker" not in text


def test_overview_says_its_window_scale_zone_and_unserved_types(
    server: Server, fleet: Callable[..., Instance], browser: object
) -> None:
    c = server.client
    page = browser.new_page()  # type: ignore[attr-defined]
    sign_in(page, server.url)
    headers = page.locator("th").all_inner_texts()
    assert "succeeded 1h" in headers and "failed 1h" in headers  # the CLI's window
    echo = page.locator("tr", has_text="echo").first
    assert "no live worker" in echo.inner_text()  # declared, but no pool runs it

    fleet()
    job_id = c.post("/v1/jobs/echo", json={"data": {"text": "hi"}}).json()["id"]
    wait_until(lambda: c.get(f"/v1/jobs/echo/{job_id}").json()["state"] == "succeeded")

    def echo_row_with_a_bar() -> str | None:
        page.reload()
        text: str = page.locator("tr", has_text="echo").first.inner_text()
        return text if "top = 1/min" in text else None

    # The per-minute counts reach Redis with the pool's next metrics flush.
    row = wait_until(echo_row_with_a_bar, what="a bar in the chart")
    assert "no live worker" not in row
    assert "60 min ago to now, top = 1/min" in row
    page.goto(f"{server.url}/dashboard/jobs/echo/{job_id}")
    assert " UTC" in page.inner_text("body")
