"""Batches over HTTP and in the dashboard, against a real `hivejobs serve` and `hivejobs run`
(tests.apps.webapp): GET /v1/batches/{id} with the API's auth and error shape, and the batch
pages in headless Chromium, live until the batch completes (as tests/web/test_dashboard.py).

The callback type is `boom` (an untyped payload, so it takes the BatchDone report): the web
app's type list stays what the other web tests expect.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx

from hivejobs import App
from tests.harness import Instance, fleet_app, wait_until
from tests.web.conftest import ADMIN, READER, Server
from tests.web.test_dashboard import browser  # noqa: F401 - the fixture

__all__ = ["browser"]


def test_batch_api_and_live_dashboard_page(
    server: Server,
    fleet: Callable[..., Instance],
    make_app: Callable[..., App],
    browser: object,  # noqa: F811 - the fixture imported above
    database_url: str,
    tmp_path: Path,
) -> None:
    fleet()
    app = fleet_app(make_app, database_url, ["echo", "boom", "hold"])
    with app.batch(on_complete="boom", data={"report": "nightly"}) as batch:
        batch.enqueue_many("echo", [{"text": str(i)} for i in range(5)])
        bad = batch.enqueue("boom", {"i": 1})
        held = batch.enqueue("hold", {})
    c = server.client
    url = f"/v1/batches/{batch.id}"
    wait_until(lambda: c.get(url).json()["pending"] == 1, what="all but the held job ended")
    got = c.get(url).json()
    assert (got["state"], got["total"], got["succeeded"], got["data"]) == (
        "sealed", 7, 5, {"report": "nightly"},
    )  # fmt: skip

    reader = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {READER}"})
    anonymous = httpx.Client(base_url=server.url)
    assert reader.get(url).status_code == 200
    assert anonymous.get(url).status_code == 401
    missing = c.get("/v1/batches/nope")
    assert (missing.status_code, missing.json()["error"]) == (404, "no batch with id 'nope'")
    refused = c.get(url, params={"failures": -1})
    assert refused.status_code == 422 and "failures" in refused.text
    assert "/v1/batches/{batch_id}" in c.get("/schema/openapi.json").json()["paths"]
    reader.close()
    anonymous.close()

    page = browser.new_page(viewport={"width": 1200, "height": 800})  # type: ignore[attr-defined]
    base = server.url
    page.goto(base + "/dashboard/login")
    page.fill("input[name=token]", ADMIN)
    page.click("#signin")
    page.wait_for_url(base + "/dashboard")
    page.goto(base + "/dashboard/batches")
    assert page.locator("tr", has_text=batch.id).count() == 1
    page.goto(f"{base}/dashboard/batches/{batch.id}")
    assert page.get_attribute("progress.batch-progress", "value") == "6"
    assert page.locator(".state").first.inner_text() == "sealed"

    # The last job ends: the page shows the batch complete without a reload.
    assert c.delete(f"/v1/jobs/hold/{held}").status_code == 200
    page.locator(".state", has_text="complete").first.wait_for(timeout=20_000)
    assert page.get_attribute("progress.batch-progress", "value") == "7"
    callback = page.locator(f"a[href$='/dashboard/jobs/boom/{batch.id}%3Acomplete']")
    assert callback.count() == 1
    not_succeeded = page.inner_text("#live table")
    assert bad in not_succeeded and held in not_succeeded
    page.screenshot(path=str(tmp_path / "batch.png"), full_page=True)

    done = c.get(url).json()
    assert (done["state"], done["failed"], done["cancelled"], done["complete_job_id"]) == (
        "complete", 1, 1, f"{batch.id}:complete",
    )  # fmt: skip
    assert sorted((f["job_id"], f["name"], f["state"]) for f in done["failures"]) == sorted(
        [(bad, "boom", "failed"), (held, "hold", "cancelled")]
    )
