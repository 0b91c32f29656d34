"""`hivejobs enqueue` without --app checks the payload against the schema the worker
declared (DESIGN invariant 5): a bad one exits 2 with one line and stores nothing."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from hivejobs.records.jobs import JobTypeInfo
from hivejobs.store import Store
from tests.harness import REDIS_URL, Instance, sql, wait_until
from tests.process.cli import cli_env, hivejobs

APP = "tests.apps.schemaapp:app"


def jobs_stored(url: str) -> int:
    live = sql(url, "SELECT count(*) FROM hivejobs_job")[0][0]
    archived = sql(url, "SELECT count(*) FROM hivejobs_archive")[0][0]
    return int(live) + int(archived)


@pytest.fixture
def declared(start_instance: Callable[..., Instance], database_url: str) -> Instance:
    """A real worker of the app, once it has declared its types' schemas."""
    inst = start_instance(app_spec=APP)
    wait_until(
        lambda: sql(database_url, "SELECT count(*) FROM hivejobs_payload_schema")[0][0] == 2,
        timeout=30,
        what="the worker's payload schemas",
    )
    return inst


BAD = [
    ('{"url": "u", "width": "wide"}', "Expected `integer`, got `string` - at `$.width`"),
    ('{"url": "u", "width": 1.0}', "Expected `integer`, got `number` - at `$.width`"),
    ('{"url": "u", "width": 0}', "0 is less than or equal to the minimum of 0 - at `$.width`"),
    ('{"width": 5}', "'url' is a required property - at `$`"),
    ('{"url": "u", "width": 5, "mode": "crop"}', "'crop' is not one of ['fill', 'fit']"),
    ('["u", 5]', "Expected `object`, got `array` - at `$`"),
]


def test_payloads_the_worker_would_reject_are_refused_without_the_app(
    declared: Instance, database_url: str, redis_prefix: str
) -> None:
    env = cli_env(HIVEJOBS_DATABASE_URL=database_url, HIVEJOBS_REDIS_URL=REDIS_URL,
                  HIVEJOBS_PREFIX=redis_prefix)  # fmt: skip
    for payload, text in BAD:
        done = hivejobs(["enqueue", "resize", payload], env)
        assert done.returncode == 2, (payload, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, done.stderr
        assert lines[0].startswith("hivejobs: payload for job type 'resize' is invalid: ")
        assert text in lines[0], (payload, lines[0])
        assert done.stdout == ""
    assert jobs_stored(database_url) == 0


def test_a_valid_payload_is_stored_and_the_worker_runs_it(
    declared: Instance, database_url: str, redis_prefix: str, ledger_dir: Path
) -> None:
    env = cli_env(HIVEJOBS_DATABASE_URL=database_url, HIVEJOBS_REDIS_URL=REDIS_URL,
                  HIVEJOBS_PREFIX=redis_prefix)  # fmt: skip
    done = hivejobs(["enqueue", "resize", '{"width": 100, "url": "/a.png"}'], env)
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip()
    ran = ledger_dir / f"resize.{job_id}"
    wait_until(ran.exists, timeout=30, what="the worker to run the job")
    assert ran.read_text() == "/a.png 100 fit"  # the worker decoded what the CLI checked
    untyped = hivejobs(["enqueue", "note", '{"anything": [1, "two"]}'], env)
    assert untyped.returncode == 0, untyped.stderr


def test_unknown_and_unchecked_types_are_refused_with_what_to_do(
    declared: Instance, database_url: str, redis_prefix: str
) -> None:
    env = cli_env(HIVEJOBS_DATABASE_URL=database_url, HIVEJOBS_REDIS_URL=REDIS_URL,
                  HIVEJOBS_PREFIX=redis_prefix)  # fmt: skip
    unknown = hivejobs(["enqueue", "resise", "{}"], env)
    assert unknown.returncode == 2
    assert "unknown job type 'resise': did you mean 'resize'?" in unknown.stderr
    # A type declared by a worker that did not publish a schema (an older version).
    store = Store(database_url)
    try:
        store.upsert_job_types(
            [JobTypeInfo(name="legacy", concurrency=1, processes=1, attempts=1,
                         delivery="at_least_once", timeout_s=None)]
        )  # fmt: skip
    finally:
        store.close()
    legacy = hivejobs(["enqueue", "legacy", "{}"], env)
    assert legacy.returncode == 2, legacy.stderr
    assert (
        "cannot check the payload of job type 'legacy': no worker declared its payload schema"
        in legacy.stderr
    )
    assert "--app MODULE:APP" in legacy.stderr
    assert jobs_stored(database_url) == 0


def test_enqueue_help_says_what_checks_the_payload_without_the_app() -> None:
    done = hivejobs(["enqueue", "--help"], cli_env())
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    assert "With --app (or HIVEJOBS_APP), by the handler's own payload type" in text
    assert "without it, against the JSON Schema the workers declared for that type" in text
    assert "A type no worker has declared a schema for is refused without --app" in text
