"""What `hivejobs serve` says at start: where the dashboard is, and (open on loopback) the
open-access warning once, not twice."""

from __future__ import annotations

from collections.abc import Callable

from tests.harness import wait_until
from tests.web.conftest import WEBAPP, Server


def test_open_serve_prints_the_dashboard_url_and_warns_once(
    start_server: Callable[..., Server],
) -> None:
    server = start_server(
        [WEBAPP, "--host", "127.0.0.1"],
        env={"HIVEJOBS_ADMIN_TOKENS": "", "HIVEJOBS_READ_TOKENS": ""},
    )
    line = f"dashboard: http://127.0.0.1:{server.port}/dashboard"
    wait_until(lambda: line in server.log_path.read_text(), what="the dashboard line")
    log = server.log_path.read_text()
    assert log.count("no token configured") == 1, log
