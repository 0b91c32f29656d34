"""Reload: `hivejobs restart` and SIGHUP recycle pools through a re-exec of the supervisor,
so new code and new job types are picked up, without losing or failing a job."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from hivejobs import App
from hivejobs.cli import main
from tests.harness import REDIS_URL, Instance, alive, ledger_oks, pool_pids, sql, wait_until


def test_restart_command_and_sighup_reload_the_instance(
    make_app: Callable[..., App],
    start_instance: Callable[..., Instance],
    database_url: str,
    redis_prefix: str,
    ledger_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    inst = start_instance({"HJ_TYPES": "alo"})
    first = wait_until(lambda: pool_pids(database_url, "alo"), what="pool")[0]
    app = make_app()
    app.types.clear()
    ids = app.enqueue_many("alo", [{"ms": 20}] * 300)

    monkeypatch.setenv("HIVEJOBS_DATABASE_URL", database_url)
    monkeypatch.setenv("HIVEJOBS_REDIS_URL", REDIS_URL)
    monkeypatch.setenv("HIVEJOBS_PREFIX", redis_prefix)
    assert main(["restart"]) == 0
    second = wait_until(
        lambda: [p for p in pool_pids(database_url, "alo") if p != first],
        timeout=20,
        what="pool after `hivejobs restart`",
    )[0]
    assert alive(inst.pid) and not alive(first)

    inst.proc.send_signal(signal.SIGHUP)
    wait_until(
        lambda: [p for p in pool_pids(database_url, "alo") if p not in (first, second)],
        timeout=20,
        what="pool after SIGHUP",
    )
    assert inst.proc.poll() is None  # the same supervisor pid, re-executed

    more = app.enqueue_many("alo", [{"ms": 1}] * 50)
    wait_until(
        lambda: sql(database_url, "SELECT count(*) FROM hivejobs_job")[0][0] == 0,
        timeout=30,
        what="all jobs done",
    )
    states = dict(sql(database_url, "SELECT id, state FROM hivejobs_archive"))
    assert {states[i] for i in ids + more} == {"succeeded"}
    oks = ledger_oks(ledger_dir)
    assert [i for i in ids + more if oks[i] != 1] == []  # nothing ran twice: no kill happened
    assert "reloading: re-executing the supervisor" in inst.log_text()
