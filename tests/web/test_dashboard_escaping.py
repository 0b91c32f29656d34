"""Markup in what users and handlers write (a job type name in the URL, an error text, a
payload's field names and values, a chain's name) shows as text on every dashboard page,
in a real headless Chromium (as tests/web/test_dashboard.py) and in the served HTML, whole
pages and live fragments alike: the templates' autoescape (web/render.py) is what escapes it.

The dashboard's CSP would keep an injected inline script from running anyway; the checks
are on the document: no element the text spells, no script but the page's own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from hivejobs import App
from hivejobs.records.jobs import Completion
from hivejobs.store import new_worker_id
from tests.web.conftest import ADMIN, Server
from tests.web.test_dashboard import browser  # noqa: F401 - the fixture

__all__ = ["browser"]

MARKUP = '<script>window.pwned=1</script><b class="pwn">bold</b>'
# A type name travels in the URL path: no "/", and a script left open.
TYPE_NAME = '<b class="pwn">type<script>window.pwned=1'


def failed_job(app: App) -> str:
    """A job of type `xss` failed for good with MARKUP as its error, its payload's field name
    and value MARKUP: claimed and finished as a pool does."""
    app.job("xss", attempts=1)(lambda c, p: None)
    app.connections.store.upsert_job_types([jt.info() for jt in app.types.values()])
    job_id = app.enqueue("xss", {MARKUP: MARKUP})
    with app.connections.store.connection() as conn:
        (job,) = app.connections.store.claim_queued([job_id], new_worker_id(), conn, name="xss")
        done = Completion(id=job.id, claim_token=job.claim_token, outcome="failed", error=MARKUP)
        app.connections.store.finish([done], conn)
    return job_id


def test_markup_from_users_and_handlers_renders_as_text(
    server: Server,
    make_app: Callable[..., App],
    browser: Any,  # noqa: F811 - the fixture imported above
) -> None:
    job_id = failed_job(make_app())
    c = server.client
    chain = {"name": MARKUP, "jobs": [{"key": "a", "type": "echo", "payload": {"text": "a"}}]}
    chain_id = c.post("/v1/chains", json=chain).json()["id"]
    pages = {
        "/dashboard/failed": MARKUP,  # the error's line in the list
        f"/dashboard/jobs/xss/{job_id}": MARKUP,  # the payload and the error
        f"/dashboard/types/{quote(TYPE_NAME, safe='')}": TYPE_NAME,  # title, buttons
        "/dashboard/chains": MARKUP,
        f"/dashboard/chains/{chain_id}": MARKUP,
    }
    for path in pages:
        for url in (path, path + ("&" if "?" in path else "?") + "fragment=1"):
            r = c.get(url)
            assert r.status_code == 200, (url, r.text)
            assert 'class="pwn"' not in r.text and "<script>window" not in r.text, url
            assert "&lt;b class=" in r.text, url

    page = browser.new_page()
    page.goto(server.url + "/dashboard/login")
    page.fill("input[name=token]", ADMIN)
    page.click("#signin")
    page.wait_for_url(server.url + "/dashboard")
    for path, text in pages.items():
        page.goto(server.url + path)
        assert page.locator(".pwn").count() == 0, path
        assert page.evaluate("document.scripts.length") == 1, path  # the dashboard's own
        assert page.evaluate("window.pwned === undefined"), path
        assert text in page.inner_text("main"), path
    page.goto(f"{server.url}/dashboard/jobs/xss/{job_id}")
    assert page.inner_text("pre.error") == MARKUP
    payload = page.inner_text("pre")  # JSON: the quotes in the markup come out as \"
    assert payload.count('<script>window.pwned=1</script><b class=\\"pwn\\">bold</b>') == 2
