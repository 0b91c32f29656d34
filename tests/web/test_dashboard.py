"""The dashboard in a real headless Chromium (Debian's, driven by Playwright): every page opens,
updates itself without a reload, its cancel/replay buttons change the jobs' state, a paused
type is marked, and a type's Pause/Resume button pauses and resumes it.

Conditions on the page are polled from the test (`page.evaluate`): Playwright's
`wait_for_function` polls with eval inside the page, which the dashboard's CSP refuses.

Screenshots go to the test's tmp dir (and to $HJ_SCREENSHOTS when set, e.g. docs/screenshots).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness import Instance, sql, wait_until
from tests.web.conftest import ADMIN, READER, Server, flow_cli

pw = pytest.importorskip("playwright.sync_api")
CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture
def browser() -> Iterator[object]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium (scripts/test does)")
    with pw.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield b
        b.close()


def count(url: str, query: str) -> int:
    return int(sql(url, query)[0][0])


def test_dashboard_pages_live_updates_and_buttons(
    server: Server,
    fleet: Callable[..., Instance],
    browser: object,
    database_url: str,
    tmp_path: Path,
) -> None:
    fleet()
    c = server.client
    shots = tmp_path / "screenshots"
    shots.mkdir()

    def shot(page: object, name: str) -> None:
        path = shots / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)  # type: ignore[attr-defined]
        if os.environ.get("HJ_SCREENSHOTS"):
            shutil.copy(path, Path(os.environ["HJ_SCREENSHOTS"]) / path.name)

    c.post("/v1/jobs/echo/batch", json={"data": [{"text": str(i)} for i in range(20)]})
    failed_ids = [c.post("/v1/jobs/boom", json={"data": {"i": i}}).json()["id"] for i in range(3)]
    chain = {
        "name": "etl",
        "jobs": [
            {"key": "extract", "type": "echo", "payload": {"text": "e"}},
            {"key": "transform", "type": "boom", "payload": {}, "after": ["extract"]},
            {"key": "audit", "type": "echo", "payload": {"text": "a"}, "after": ["extract"]},
            {"key": "load", "type": "echo", "payload": {"text": "l"}, "after": ["transform"]},
        ],
    }
    chain_id = c.post("/v1/chains", json=chain).json()["id"]
    for job_id in failed_ids:
        wait_until(lambda j=job_id: c.get(f"/v1/jobs/boom/{j}").json()["state"] == "failed")
    wait_until(lambda: c.get(f"/v1/chains/{chain_id}").json()["state"] == "failed")

    page = browser.new_page(viewport={"width": 1200, "height": 800})  # type: ignore[attr-defined]
    base = server.url
    page.goto(base + "/dashboard/workers")
    assert "token" in page.content()  # not signed in: a JSON 401
    page.goto(base + "/dashboard/login")
    page.fill("input[name=token]", ADMIN)
    page.click("#signin")
    page.wait_for_url(base + "/dashboard")

    # Job types: live counts without a reload (the page re-fetches its fragment).
    row = page.locator("tr", has_text="echo").first
    assert row.is_visible()
    echo_done = "SELECT count(*) FROM hivejobs_archive WHERE name = 'echo'"
    done = count(database_url, echo_done)
    c.post("/v1/jobs/echo/batch", json={"data": [{"text": "more"}] * 5})
    wait_until(lambda: count(database_url, echo_done) == done + 5, what="5 more echo jobs")
    shown = (
        "n => [...document.querySelectorAll('tr')].some(r => r.cells[0] &&"
        " r.cells[0].innerText === 'echo' && r.cells[4].innerText === String(n))"
    )
    wait_until(lambda: page.evaluate(shown, done + 5), 20, what="the live count of echo")
    assert page.locator("svg.chart").count() >= 4
    shot(page, "overview")

    # A running job: Cancel, and the page shows it cancelled.
    held = c.post("/v1/jobs/hold", json={"data": {}}).json()["id"]
    wait_until(lambda: c.get(f"/v1/jobs/hold/{held}").json()["state"] == "running")
    page.goto(f"{base}/dashboard/jobs/hold/{held}")
    assert page.locator(".state").first.inner_text() == "running"
    page.click("#cancel")
    page.locator(".state", has_text="cancelled").first.wait_for(timeout=20_000)
    assert c.get(f"/v1/jobs/hold/{held}").json()["state"] == "cancelled"
    shot(page, "job-cancelled")

    # A failed job: its traceback, then Replay makes a new job.
    page.goto(f"{base}/dashboard/jobs/boom/{failed_ids[0]}")
    assert "boom: the handler failed on purpose" in page.inner_text("pre.error")
    assert "Traceback" in page.inner_text("pre.error")
    shot(page, "job-failed")
    boom_jobs = (
        "SELECT (SELECT count(*) FROM hivejobs_job WHERE name = 'boom') + "
        "(SELECT count(*) FROM hivejobs_archive WHERE name = 'boom')"
    )
    before = count(database_url, boom_jobs)
    page.click("#replay")
    page.locator("#flash", has_text="done: ").wait_for(timeout=10_000)
    assert count(database_url, boom_jobs) == before + 1

    # Failed jobs: tick two, bulk replay.
    page.goto(base + "/dashboard/failed")
    for job_id in failed_ids[1:]:
        page.check(f"input.pick[value='{job_id}']")
    shot(page, "failed")
    page.click("text=Replay selected")
    page.locator("#flash", has_text="done").wait_for(timeout=10_000)
    wait_until(lambda: count(database_url, boom_jobs) == before + 3, what="two replays")

    # A type's finished jobs, keyset-paged.
    page.goto(base + "/dashboard/types/echo?state=finished")
    assert page.locator("input.pick").count() == done + 5

    # Chains: the list, and the DAG coloured by state.
    page.goto(base + "/dashboard/chains")
    assert page.locator("tr", has_text="etl").count() == 1
    page.goto(f"{base}/dashboard/chains/{chain_id}")
    states = {
        key: page.get_attribute(f"g.node[data-key='{key}']", "data-state")
        for key in ("extract", "transform", "audit", "load")
    }
    assert states == {
        "extract": "succeeded",
        "transform": "failed",
        "audit": "succeeded",
        "load": "pending",
    }
    assert page.get_attribute("g.node[data-key='transform'] rect", "fill") == "#d64545"
    assert page.locator("svg.dag line").count() == 3
    shot(page, "chain")

    # Workers: heartbeats and the leader.
    page.goto(base + "/dashboard/workers")
    assert "(leader)" in page.inner_text("#live")
    assert page.locator("span.hb").count() == 5  # four pools and the coordinator
    shot(page, "workers")
    assert len(list(shots.glob("*.png"))) == 6


def test_dashboard_shows_a_paused_type_and_its_resume_live(
    server: Server, web_env: dict[str, str], browser: object
) -> None:
    """Paused from the CLI: the job types page marks it and the type's page says what to do;
    resumed, the open page drops the mark without a reload (its live fragment)."""
    assert flow_cli(web_env, "pause", "echo") == "paused"
    page = browser.new_page(viewport={"width": 1200, "height": 800})  # type: ignore[attr-defined]
    base = server.url
    page.goto(base + "/dashboard/login")
    page.fill("input[name=token]", ADMIN)
    page.click("#signin")
    page.wait_for_url(base + "/dashboard")
    header = page.locator("th").all_inner_texts()
    column = header.index("paused")
    cell = "name => [...document.querySelectorAll('tr')].find(r => r.cells[0] && r.cells[0]"
    cell += f".innerText === name).cells[{column}]"
    echo = page.evaluate(f"({cell})('echo').innerText")
    assert echo.startswith("paused since ")
    assert page.evaluate(f"({cell})('echo').querySelector('.state').innerText") == "paused"
    assert page.evaluate(f"({cell})('boom').innerText") == "-"
    page.goto(base + "/dashboard/types/echo")
    assert "hivejobs resume echo" in page.inner_text("p.paused-notice")
    page.goto(base + "/dashboard")
    assert flow_cli(web_env, "resume", "echo") == "resumed"
    resumed = f"({cell})('echo').innerText === '-'"
    wait_until(lambda: page.evaluate(resumed), 20, what="echo's paused mark to go")
    page.goto(base + "/dashboard/types/echo")
    assert page.locator("p.paused-notice").count() == 0


def test_dashboard_pauses_and_resumes_a_type(
    server: Server, browser: object, database_url: str
) -> None:
    """From a type's page an admin pauses and resumes it (the buttons call the JSON API with
    the login cookie); a read-only sign-in gets the API's refusal and changes nothing."""
    base = server.url
    paused = "SELECT count(*) FROM hivejobs_flow WHERE name = 'echo' AND paused"

    def signed_in(token: str) -> Any:
        context = browser.new_context(viewport={"width": 1200, "height": 800})  # type: ignore[attr-defined]
        page = context.new_page()
        page.goto(base + "/dashboard/login")
        page.fill("input[name=token]", token)
        page.click("#signin")
        page.wait_for_url(base + "/dashboard")
        page.goto(base + "/dashboard/types/echo")
        return page

    page = signed_in(ADMIN)
    assert page.locator("p.paused-notice").count() == 0
    page.click("#pause")
    page.locator("p.paused-notice").wait_for(timeout=10_000)
    assert page.inner_text("p.paused-notice").startswith("paused since ")
    assert page.locator("#pause").count() == 0 and page.locator("#resume").is_visible()
    assert count(database_url, paused) == 1
    page.goto(base + "/dashboard")
    echo_row = page.locator("tr", has_text="echo").first
    assert "paused since" in echo_row.inner_text()

    reader = signed_in(READER)
    reader.click("#resume")
    reader.locator("#flash", has_text="read-only").wait_for(timeout=10_000)
    assert count(database_url, paused) == 1

    page.goto(base + "/dashboard/types/echo")
    page.click("#resume")
    page.locator("#pause").wait_for(timeout=10_000)
    assert page.locator("p.paused-notice").count() == 0
    assert count(database_url, paused) == 0
    reader.goto(base + "/dashboard/types/echo")
    reader.click("#pause")
    reader.locator("#flash", has_text="read-only").wait_for(timeout=10_000)
    assert count(database_url, paused) == 0

    # A scale set over the API is shown on the type's page, live.
    assert (
        server.client.put("/v1/jobtypes/echo/concurrency", json={"concurrency": 6}).status_code
        == 200
    )
    page.locator("p.scaled", has_text="Scaled to 6 runner threads").wait_for(timeout=10_000)
