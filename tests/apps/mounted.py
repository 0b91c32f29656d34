"""A host ASGI app (Litestar) with hivejobs' web app mounted at /jobs, as a user would."""

from __future__ import annotations

import os

from litestar import Litestar, get
from litestar import asgi as asgi_route
from litestar.types import Receive, Scope, Send

from hivejobs.web import create_app
from tests.apps.webapp import app

jobs_web = create_app(
    app, admin_tokens=os.environ.get("HIVEJOBS_ADMIN_TOKENS", "").split(","), base_path="/jobs"
)


@get("/hello")
async def hello() -> str:
    return "the host app"


@asgi_route("/jobs", is_mount=True)
async def mount_jobs(scope: Scope, receive: Receive, send: Send) -> None:
    await jobs_web(scope, receive, send)


asgi = Litestar([hello, mount_jobs])
