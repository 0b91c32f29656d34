"""Operator commands at the edges, against real Postgres and Redis: the CLI's enqueue options and
option placement, gauges of a drained type, stop arguments, output capture bounds."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import hivejobs.client.chains as chains_api
from hivejobs import App, Chain, ChainStopPending, InvalidArgument
from hivejobs.coordinator.gauges import Gauges
from hivejobs.worker.capture import capturing
from tests.harness import ROOT, sql


def cli(database_url: str, redis_prefix: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        "HIVEJOBS_DATABASE_URL": database_url,
        "HIVEJOBS_REDIS_URL": os.environ.get("HIVEJOBS_TEST_REDIS_URL", "redis://127.0.0.1:6379/0"),
        "HIVEJOBS_PREFIX": redis_prefix,
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
    }
    return subprocess.run(
        [sys.executable, "-m", "hivejobs", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_enqueue_cli_takes_id_priority_delay_run_at_and_expires_at(
    database_url: str, redis_prefix: str, make_app: Callable[..., App]
) -> None:
    app_opt = ("--app", "tests.apps.controlapp:app")
    at = (datetime.now(UTC) + timedelta(minutes=5)).replace(microsecond=0)
    done = cli(
        database_url,
        redis_prefix,
        "enqueue",
        "quick",
        "{}",
        *app_opt,
        "--id",
        "order-42",
        "--priority",
        "3",
        "--run-at",
        at.isoformat(),
        "--expires-at",
        "2h",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "order-42"
    info = make_app().get_job("order-42")
    assert (info.state, info.priority, info.run_at) == ("scheduled", 3, at)
    assert info.expires_at is not None
    left = (info.expires_at - datetime.now(UTC)).total_seconds()
    assert 7000 < left <= 7200
    delayed = cli(database_url, redis_prefix, "enqueue", *app_opt, "quick", "{}", "--delay", "30")
    assert delayed.returncode == 0, delayed.stderr
    job = make_app().get_job(delayed.stdout.strip())
    assert 29 <= (job.run_at - job.created_at).total_seconds() <= 31
    clash = cli(
        database_url, redis_prefix, "enqueue", *app_opt, "quick", "{}", "--delay", "1",
        "--run-at", "10m",
    )  # fmt: skip
    assert clash.returncode == 2 and "either delay or run_at" in clash.stderr
    garbled = cli(
        database_url, redis_prefix, "enqueue", *app_opt, "quick", "{}", "--expires-at", "soon"
    )
    assert garbled.returncode == 2 and "neither a span" in garbled.stderr


@pytest.mark.parametrize(
    "placement",
    [
        ("chain", "run", "{file}", "--app", "tests.apps.controlapp:app"),
        ("chain", "--app", "tests.apps.controlapp:app", "run", "{file}"),
        ("--app", "tests.apps.controlapp:app", "chain", "run", "{file}"),
    ],
)
def test_app_option_is_accepted_before_or_after_the_subcommand(
    database_url: str, redis_prefix: str, tmp_path: Path, placement: tuple[str, ...]
) -> None:
    chain = Chain("placed")
    chain.job("quick", {}, key="only")
    path = tmp_path / "chain.json"
    path.write_bytes(chain.to_json())
    args = [a.replace("{file}", str(path)) for a in placement]
    done = cli(database_url, redis_prefix, *args)
    assert done.returncode == 0, done.stderr
    rows = sql(database_url, "SELECT id, name FROM hivejobs_chain")
    assert rows == [(done.stdout.strip(), "placed")]


def test_gauges_of_a_type_whose_jobs_all_ended_drop_to_zero(make_app: Callable[..., App]) -> None:
    app = make_app()
    app.job("resize")(lambda ctx, payload: None)
    app.job("email")(lambda ctx, payload: None)
    job_ids = [app.enqueue("resize", {}) for _ in range(3)]
    app.enqueue("email", {})
    gauges = Gauges(app.connections.store)
    gauges.run_once()

    def rows() -> dict[tuple[str, str], int]:
        found = sql(app.settings.database_url, "SELECT name, queue, value FROM hivejobs_gauge")
        return {(r[0], r[1]): r[2] for r in found}

    assert rows()[("queued", "resize")] == 3
    for job_id in job_ids:
        app.cancel(job_id)
    gauges.run_once()
    assert rows()[("queued", "resize")] == 0  # was kept at 3 for ever
    assert rows()[("running", "resize")] == 0
    assert rows()[("queued", "email")] == 1


def test_stop_chain_arguments(
    make_app: Callable[..., App], monkeypatch: pytest.MonkeyPatch
) -> None:
    app = make_app()
    app.job("quick")(lambda ctx, payload: None)
    chain = Chain("no-coordinator")
    chain.job("quick", {}, key="only")
    request_id = app.run_chain(chain)
    with pytest.raises(InvalidArgument, match="stop timeout must be"):
        app.stop_chain(request_id, timeout=-1)
    # No coordinator runs here: waiting gives up with an error that says what to check.
    monkeypatch.setattr(chains_api, "WAIT_MARGIN_S", 0.3)
    with pytest.raises(ChainStopPending, match="is a coordinator running"):
        app.stop_chain(request_id, timeout=0.0, wait=True)
    assert app.chain_status(request_id).stop_requested


def test_capture_is_per_thread_and_keeps_the_tail() -> None:
    other_wrote = threading.Event()

    def other() -> None:
        print("from another thread")
        other_wrote.set()

    with capturing(50) as out:
        print("x" * 100)
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
        print("last line", file=sys.stderr)
    assert other_wrote.is_set()
    text = out.stdout.text()
    assert text is not None and text.startswith("[... 51 bytes cut ...]\n")
    assert "another thread" not in text and text.endswith("x" * 49 + "\n")
    assert out.stderr.text() == "last line\n" and out.truncated
