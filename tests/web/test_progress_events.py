"""GET /v1/jobs/{name}/{id}/events against a real `hivejobs serve` and `hivejobs run`: server-
sent events read by a real HTTP client (httpx), and the dashboard job page's progress bar
in a real headless Chromium, moving while the job runs.

The job waits at a gate before each step (tests/apps/progressapp.py) and the test opens the
next gate only once the reader showed the previous step: what the reader shows arrived
while the job ran.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from hivejobs import App
from tests.apps.gate import open_gate
from tests.harness import Instance, fleet_app, wait_until
from tests.web.conftest import ADMIN, READER, Server

APP = "tests.apps.progressapp:app"


@pytest.fixture
def served(
    start_server: Callable[..., Server],
    start_instance: Callable[..., Instance],
    web_env: dict[str, str],
    make_app: Callable[..., App],
    database_url: str,
) -> tuple[Server, App]:
    env = {k: v for k, v in web_env.items() if k.startswith(("HJ_", "HIVEJOBS_"))}
    start_instance(extra_env=env, app_spec=APP)
    app = fleet_app(make_app, database_url, ["steps"])
    return start_server([APP]), app


def subscribers(app: App, job_id: str) -> int:
    channel = app.connections.broker.events_channel(job_id)
    return int(dict(app.connections.broker.redis.pubsub_numsub(channel))[channel.encode()])


def sse(lines: Iterator[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(event, data) of each server-sent event; comments (pings) skipped."""
    event, data = "message", ""
    for line in lines:
        if line == "":
            if data:
                yield event, json.loads(data)
            event, data = "message", ""
        elif line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data += line[5:].strip()


def test_events_are_served_as_sse_live_until_the_end(served: tuple[Server, App]) -> None:
    server, app = served
    c = server.client
    job_id = c.post("/v1/jobs/steps", json={"data": {"n": 3, "gate": "e"}}).json()["id"]
    reader = httpx.Client(
        base_url=server.url, headers={"Authorization": f"Bearer {READER}"}, timeout=30
    )
    seen: list[tuple[str, dict[str, Any]]] = []
    with reader.stream("GET", f"/v1/jobs/steps/{job_id}/events") as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        wait_until(lambda: subscribers(app, job_id) == 1, what="the SSE stream subscribed")
        open_gate(app.connections.broker, "e:0")
        for kind, data in sse(response.iter_lines()):
            seen.append((kind, data))
            assert data["kind"] == kind and data["job_id"] == job_id
            if kind == "progress":
                open_gate(app.connections.broker, f"e:{int(data['done'])}")
    # The response ended by itself after the end event.
    assert [(k, d.get("done"), d.get("note")) for k, d in seen if k == "progress"] == [
        ("progress", 1.0, "step 1"),
        ("progress", 2.0, "step 2"),
        ("progress", 3.0, "step 3"),
    ]
    assert [d["data"] for k, d in seen if k == "emit"] == [{"step": i} for i in (1, 2, 3)]
    assert seen[-1] == (
        "end",
        {"kind": "end", "job_id": job_id, "attempt": 1, "state": "succeeded"},
    )

    # After the end: the last progress and the end, at once.
    late = c.get(f"/v1/jobs/steps/{job_id}/events")
    assert [kind for kind, _ in sse(iter(late.text.splitlines()))] == ["progress", "end"]

    # Refusals: no token, an unknown job, a job under another type's path.
    assert httpx.get(f"{server.url}/v1/jobs/steps/{job_id}/events").status_code == 401
    missing = c.get("/v1/jobs/steps/no-such-job/events")
    assert missing.status_code == 404 and "no-such-job" in missing.json()["error"]
    assert c.get(f"/v1/jobs/bounds/{job_id}/events").status_code == 404
    reader.close()

    spec = c.get("/schema/openapi.json").json()
    op = spec["paths"]["/v1/jobs/{name}/{job_id}/events"]["get"]
    assert op["operationId"] == "job_events"
    assert "text/event-stream" in op["responses"]["200"]["content"]


def test_the_job_page_bar_moves_while_the_job_runs(
    served: tuple[Server, App], chromium: Any, tmp_path: Path
) -> None:
    server, app = served
    c = server.client
    job_id = c.post("/v1/jobs/steps", json={"data": {"n": 4, "gate": "d"}}).json()["id"]
    wait_until(lambda: c.get(f"/v1/jobs/steps/{job_id}").json()["state"] == "running")
    page = chromium.new_page()
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    page.goto(server.url + "/dashboard/login")
    page.fill("input[name=token]", ADMIN)
    page.click("#signin")
    page.wait_for_url(server.url + "/dashboard")
    page.goto(f"{server.url}/dashboard/jobs/steps/{job_id}")
    assert page.inner_text("#progress-text") == "no progress reported yet"
    wait_until(lambda: subscribers(app, job_id) == 1, what="the page's event stream")
    assert any(u.endswith(f"/v1/jobs/steps/{job_id}/events") for u in requests)

    bar = "() => { const b = document.getElementById('progress-bar'); return b && b.value; }"
    for step in range(4):
        open_gate(app.connections.broker, f"d:{step}")
        wait_until(lambda s=step: page.evaluate(bar) == s + 1, 20, what=f"the bar at {step + 1}")
        assert page.inner_text("#progress-text").startswith(f"{step + 1}/4")
    page.locator(".state", has_text="succeeded").first.wait_for(timeout=20_000)
    assert page.evaluate(bar) == 4 and "4/4 (100%) step 4" in page.inner_text("#progress-text")
    page.screenshot(path=str(tmp_path / "progress.png"), full_page=True)


@pytest.fixture
def chromium() -> Iterator[object]:
    from tests.web.test_dashboard import ARGS, CHROMIUM, pw

    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium (scripts/test does)")
    with pw.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield b
        b.close()
