"""`hivejobs jobs ... --json` on a listing: the page as JSON (the HTTP API's shape), its
`next` cursor included, so a script can walk every page."""

from __future__ import annotations

import json
from collections.abc import Callable

from hivejobs import App
from tests.process.cli import cli_env, hivejobs


def test_listing_json_pages_with_their_cursor(
    make_app: Callable[..., App], instance_env: dict[str, str]
) -> None:
    app = make_app()
    app.job("mail")(lambda ctx, payload: None)
    ids = [app.enqueue("mail", {"n": i}) for i in range(3)]
    env = cli_env(**{k: v for k, v in instance_env.items() if k.startswith("HIVEJOBS_")})

    first = hivejobs(["jobs", "--type", "mail", "--limit", "2", "--json"], env)
    assert first.returncode == 0, first.stderr
    page = json.loads(first.stdout)
    assert len(page["jobs"]) == 2 and page["next"]
    assert {"id", "name", "state", "error", "error_line"} <= set(page["jobs"][0])
    rest = hivejobs(["jobs", "--type", "mail", "--json", "--after", page["next"]], env)
    last = json.loads(rest.stdout)
    assert last["next"] is None
    assert sorted(j["id"] for j in page["jobs"] + last["jobs"]) == sorted(ids)
