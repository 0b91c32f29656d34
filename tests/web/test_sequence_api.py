"""A held sequence seen and released over HTTP (`/v1/jobtypes/{name}/keys`) and with
`hivejobs keys`, against a real `hivejobs serve` of the sequence test app; the hold is made
as a pool makes it (a sequenced claim, then a failure for good)."""

from __future__ import annotations

from collections.abc import Callable

import httpx

from hivejobs import App
from hivejobs.records.jobs import Completion
from hivejobs.store import new_worker_id
from tests.process.cli import cli_env, hivejobs
from tests.web.conftest import READER, Server

APP = "tests.apps.sequenceapp:app"


def held_key(app: App) -> tuple[str, str]:
    """Key "a" of `held`: its first job failed for good, the second waits."""
    app.job("held", attempts=1, sequence_by="account", on_failure="hold")(lambda c, p: None)
    app.connections.store.upsert_job_types([jt.info() for jt in app.types.values()])
    first = app.enqueue("held", {"account": "a", "i": 0})
    second = app.enqueue("held", {"account": "a", "i": 1})
    with app.connections.store.connection() as conn:
        (job,) = app.connections.store.claim_queued(
            [first], new_worker_id(), conn, name="held", sequenced=True
        )
        done = Completion(id=job.id, claim_token=job.claim_token, outcome="failed", error="x")
        app.connections.store.finish([done], conn)
    return first, second


def test_a_held_key_is_listed_and_released(
    start_server: Callable[..., Server],
    make_app: Callable[..., App],
    web_env: dict[str, str],
) -> None:
    first, second = held_key(make_app())
    server = start_server([APP])
    listed_keys = server.client.get("/v1/jobtypes/held/keys").json()
    assert (listed_keys["sequence_by"], listed_keys["keys"]) == ("account", [])
    (key,) = listed_keys["sequence"]
    assert (key["key"], key["held_by"], key["held_error"], key["next_id"]) == (
        '"a"', first, "x", second,
    )  # fmt: skip
    assert (key["queued"], key["running"]) == (1, 0)
    page = server.client.get("/dashboard/types/held")
    assert page.status_code == 200, page.text
    assert 'class="held-notice"' in page.text and first in page.text
    assert "&#34;a&#34;" in page.text or "&quot;a&quot;" in page.text  # the key, escaped
    metrics = server.client.get("/metrics").text
    assert 'hivejobs_sequence_held_keys{job_type="held"} 1' in metrics

    env = cli_env(**{k: v for k, v in web_env.items() if k.startswith("HIVEJOBS_")})
    listed = hivejobs(["keys", "held", "--app", APP], env)
    assert listed.returncode == 0, listed.stderr
    assert first in listed.stdout and '"a"' in listed.stdout
    unsequenced = hivejobs(["keys", "ordered_nope", "--app", APP], env)
    assert unsequenced.returncode != 0 and "ordered_nope" in unsequenced.stderr

    reader = httpx.post(
        str(server.client.base_url) + "/v1/jobtypes/held/keys/release",
        json={"key": '"a"'},
        headers={"authorization": f"Bearer {READER}"},
    )
    assert reader.status_code == 403
    released = server.client.post("/v1/jobtypes/held/keys/release", json={"key": '"a"'})
    assert released.json() == {"released": True, "held_by": first}
    assert server.client.get("/v1/jobtypes/held/keys").json()["sequence"][0]["held_by"] is None
    assert 'class="held-notice"' not in server.client.get("/dashboard/types/held").text
    again = hivejobs(["keys", "held", "--release", '"a"', "--app", APP], env)
    assert again.stdout.strip() == "was not held"
