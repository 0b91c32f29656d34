"""The CLI a person reads: bare `hivejobs`, --version, `status` as text (the traceback as
lines) and --json, `jobs` marking types without a live pool or paused, `workers --json`."""

from __future__ import annotations

import json
import os
import re
import socket
from collections.abc import Callable

import pytest

from hivejobs import App, JobContext
from hivejobs.cli import main
from hivejobs.store import new_worker_id
from hivejobs.testing import drain


@pytest.fixture
def cli_env(monkeypatch: pytest.MonkeyPatch, make_app: Callable[..., App]) -> App:
    app = make_app()
    monkeypatch.setenv("HIVEJOBS_DATABASE_URL", app.settings.database_url)
    monkeypatch.setenv("HIVEJOBS_REDIS_URL", app.settings.redis_url)
    monkeypatch.setenv("HIVEJOBS_PREFIX", app.settings.prefix)
    monkeypatch.delenv("HIVEJOBS_APP", raising=False)
    return app


def test_bare_command_prints_usage_and_commands_and_exits_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main([]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: hivejobs")
    assert "migrate" in err and "workers" in err and "HIVEJOBS_DATABASE_URL" in err


def test_version_and_help_with_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.startswith("hivejobs ")
    with pytest.raises(SystemExit):
        main(["chain", "list", "--help"])
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    out = capsys.readouterr().out
    assert "MODULE:APP" in out and "HIVEJOBS_LOG_FORMAT" in out


def test_status_shows_the_traceback_as_text_and_json_on_request(
    cli_env: App, capsys: pytest.CaptureFixture[str]
) -> None:
    @cli_env.job("breaks", attempts=1)
    def breaks(ctx: JobContext, payload: dict[str, int]) -> None:
        raise RuntimeError(f"broke on {payload['n']}")

    job_id = cli_env.enqueue("breaks", {"n": 7})
    assert drain(cli_env).failed == 1
    assert main(["status", job_id]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert f"id           {job_id}" in lines and "state        failed" in lines
    at = lines.index("error:")
    assert lines[at + 1] == "  Traceback (most recent call last):"
    assert "  RuntimeError: broke on 7" in lines
    assert main(["status", job_id, "--json", "--payload"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["state"] == "failed" and data["payload"] == {"n": 7}
    assert "RuntimeError: broke on 7" in data["error"]


def test_jobs_marks_types_without_a_live_pool_and_lists_json(
    cli_env: App, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("served", "orphan"):
        cli_env.job(name)(lambda ctx, payload: None)
    store = cli_env.connections.store
    from hivejobs.records.jobs import JobTypeInfo

    store.upsert_job_types(
        [
            JobTypeInfo(
                name=n,
                concurrency=1,
                processes=1,
                attempts=1,
                delivery="at_least_once",
                timeout_s=None,
            )
            for n in ("served", "orphan")
        ]
    )
    worker = new_worker_id()
    store.register_worker(worker, socket.gethostname(), os.getpid(), "pool", "served")
    cli_env.enqueue("orphan", {})
    assert main(["jobs"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    assert rows["orphan"].endswith("none: not processed  -")
    assert rows["served"].split()[-2:] == ["1", "-"]  # one live pool, not paused
    assert main(["jobs", "--json"]) == 0
    counts = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert (counts["orphan"]["live_pools"], counts["orphan"]["queued"]) == (0, 1)
    assert counts["served"]["live_pools"] == 1
    assert main(["workers", "--json"]) == 0
    workers = json.loads(capsys.readouterr().out)
    assert [(w["id"], w["pool"]) for w in workers] == [(worker, "served")]


def test_jobs_shows_which_types_are_paused(
    cli_env: App, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("held", "going"):
        cli_env.job(name)(lambda ctx, payload: None)
    cli_env.connections.store.upsert_job_types([jt.info() for jt in cli_env.types.values()])
    assert main(["pause", "held"]) == 0
    capsys.readouterr()
    assert main(["jobs"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[-1] == "paused"
    rows = {line.split()[0]: line for line in lines[1:]}
    assert re.search(r"since \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC$", rows["held"])
    assert rows["going"].endswith(" -")
    assert main(["jobs", "--json"]) == 0
    counts = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert counts["held"]["paused_at"] is not None and counts["going"]["paused_at"] is None
    assert main(["resume", "held"]) == 0
    capsys.readouterr()
    assert main(["jobs", "--json"]) == 0
    assert all(r["paused_at"] is None for r in json.loads(capsys.readouterr().out))
