"""A fair type's keys over HTTP and in the CLI, from a `hivejobs serve` and a `hivejobs` that
have no code of the type: they learn its fair_by from what its workers declared (migration
0016), refuse a payload without the field, and count the jobs per key."""

from __future__ import annotations

import json
from collections.abc import Callable

from hivejobs import App
from hivejobs.payload_schema import declare_schemas
from tests.harness import sql
from tests.process.cli import cli_env, hivejobs
from tests.web.conftest import Server


def declare_fair_types(make_app: Callable[..., App]) -> App:
    """The types of tests/apps/fairapp.py declared in Postgres, as its workers would."""
    from tests.apps.fairapp import app as fairapp

    app = make_app()
    app.connections.store.upsert_job_types([jt.info() for jt in fairapp.types.values()])
    declare_schemas(app.connections.store, fairapp.types)
    return app


def test_keys_of_a_fair_type_over_http_and_in_the_cli(
    start_server: Callable[..., Server],
    make_app: Callable[..., App],
    database_url: str,
    web_env: dict[str, str],
) -> None:
    declare_fair_types(make_app)
    server = start_server([""])  # no app: every type it knows is declared
    c = server.client
    for customer in ["a", "a", "a", "b"]:
        r = c.post("/v1/jobs/fair", json={"data": {"customer": customer}})
        assert r.status_code == 201, r.text
    assert c.post("/v1/jobs/fair", json={"data": {"customer": 7}, "delay": 60}).status_code == 201

    keys = c.get("/v1/jobtypes/fair/keys").json()
    assert keys == {
        "name": "fair",
        "fair_by": "customer",
        "keys": [
            {"key": "a", "queued": 3, "running": 0, "scheduled": 0},
            {"key": "b", "queued": 1, "running": 0, "scheduled": 0},
            {"key": "7", "queued": 0, "running": 0, "scheduled": 1},
        ],
    }
    assert c.get("/v1/jobtypes/fair/keys", params={"limit": 1}).json()["keys"][0]["key"] == "a"
    not_fair = c.get("/v1/jobtypes/fifo/keys")
    assert not_fair.status_code == 422
    assert "has no fair_by" in not_fair.text

    missing = c.post("/v1/jobs/fair", json={"data": {"who": "a"}})
    assert missing.status_code == 422
    assert "the payload has no 'customer' field (fair_by)" in missing.text
    assert sql(database_url, "SELECT count(*) FROM hivejobs_job") == [(5,)]
    # One series per type, never per key (no worker ran: nothing in the ring yet).
    assert 'hivejobs_fair_active_keys{job_type="fair"} 0' in c.get("/metrics").text

    page = c.get("/dashboard/types/fair").text  # the type page's keys, escaped
    assert '<h2 id="fair-keys">Keys of customer (fair dispatch)' in page
    assert "<tr><td>a</td><td>3</td><td>0</td><td>0</td></tr>" in page
    assert 'id="fair-keys"' not in c.get("/dashboard/types/fifo").text

    hj = {k: v for k, v in web_env.items() if k.startswith("HIVEJOBS_")}
    done = hivejobs(["jobs", "--type", "fair", "--by-key", "--json"], cli_env(**hj))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == keys["keys"]
    table = hivejobs(["jobs", "--type", "fair", "--by-key"], cli_env(**hj))
    assert table.stdout.splitlines()[1].split() == ["a", "3", "0", "0"]
    usage = hivejobs(["jobs", "--by-key"], cli_env(**hj))
    assert (usage.returncode, usage.stderr.strip()) == (
        2,
        "hivejobs: --by-key needs --type NAME (a job type declared with fair_by)",
    )
