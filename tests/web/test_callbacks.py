"""rickover's status callbacks end to end: `hivejobs run` hands `remote` jobs to a second
process (tests/apps/other_service.py) that reports each attempt over HTTP to `hivejobs serve`."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hivejobs import App
from tests.harness import ROOT, Instance, sql, wait_until
from tests.web.conftest import ADMIN, Server


@pytest.fixture
def other_service(
    server: Server, ledger_dir: Path, web_env: dict[str, str]
) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(
        [sys.executable, "tests/apps/other_service.py", server.url, str(ledger_dir), ADMIN],
        cwd=ROOT,
        env=web_env,
    )
    yield proc
    proc.terminate()
    proc.wait(10)


def test_status_callbacks_from_another_process(
    server: Server,
    fleet: Callable[..., Instance],
    other_service: subprocess.Popen[bytes],
    make_app: Callable[..., App],
    ledger_dir: Path,
    database_url: str,
) -> None:
    # Answers must never race the timeout: the jobs that get one run under the type's long
    # default (60 s). The timeout path runs afterwards, on a fleet whose timeout is short, with
    # a job that nobody answers: its outcome depends on no one's speed.
    answering = fleet()
    c = server.client

    def enqueue(plan: list[str]) -> str:
        r = c.post("/v1/jobs/remote", json={"data": {"plan": plan}})
        assert r.status_code == 201
        return str(r.json()["id"])

    def job(job_id: str) -> dict[str, object]:
        return dict(c.get(f"/v1/jobs/remote/{job_id}").json())

    def ended(job_id: str) -> bool:
        return job(job_id)["state"] in ("succeeded", "failed", "cancelled")

    ok = enqueue(["succeed"])
    retried = enqueue(["fail_retry", "succeed"])
    failed = enqueue(["fail"])
    by_python = enqueue(["ignore", "ignore", "ignore"])
    cancelled = enqueue(["ignore", "ignore", "ignore"])

    # Handed over and not yet answered: running, held by no worker, with a deadline.
    wait_until(lambda: (ledger_dir / f"handed.{by_python}").exists(), what="hand-over")
    wait_until(lambda: (ledger_dir / f"answers.{by_python}").exists(), what="ignored once")
    row = sql(
        database_url,
        "SELECT state, worker_id, callback_deadline IS NOT NULL FROM hivejobs_job WHERE id = %s",
        (by_python,),
    )
    assert row == [("running", None, True)]
    python_app = make_app()
    python_app.types.clear()  # as a web process that knows the types from Postgres only
    result = python_app.complete_callback("remote", by_python, status="succeeded", attempt=1)
    assert result.outcome == "succeeded"
    wait_until(lambda: (ledger_dir / f"handed.{cancelled}").exists(), what="hand-over")
    assert c.delete(f"/v1/jobs/remote/{cancelled}").json()["outcome"] == "cancelled"
    for job_id in (ok, retried, failed):
        wait_until(lambda j=job_id: ended(j), timeout=60, what=f"job {job_id} to end")
    answering.signal_group(signal.SIGTERM)
    assert answering.wait(30) == 0

    fleet({"HJ_CALLBACK_TIMEOUT_S": "1"})
    timed_out = enqueue(["ignore", "ignore", "ignore"])
    wait_until(lambda: ended(timed_out), timeout=60, what=f"job {timed_out} to end")

    assert (job(ok)["state"], job(ok)["attempt"]) == ("succeeded", 1)
    assert (job(retried)["state"], job(retried)["attempt"]) == ("succeeded", 2)
    assert (ledger_dir / f"handed.{retried}").read_text().split() == ["1", "2"]
    assert (job(failed)["state"], job(failed)["error"]) == ("failed", "callback: failed")
    assert (job(timed_out)["state"], job(timed_out)["attempt"]) == ("failed", 3)
    assert job(timed_out)["error"] == "callback timed out"
    assert (ledger_dir / f"handed.{timed_out}").read_text().split() == ["1", "2", "3"]
    assert (job(by_python)["state"], job(cancelled)["state"]) == ("succeeded", "cancelled")

    # The other service saw 409 for every wrong attempt and 200 for every real answer.
    answers = (ledger_dir / f"answers.{retried}").read_text().split("\n")
    assert answers[:2] == ["1 fail_retry 409 200", "2 succeed 409 200"]
    # A callback for a finished job, for a non-callback type, for an unknown job.
    late = c.post(f"/v1/jobs/remote/{ok}", json={"status": "failed", "attempt": 1})
    assert late.status_code == 409 and "succeeded at attempt 1" in late.json()["error"]
    echo = c.post("/v1/jobs/echo", json={"data": {"text": "x"}}).json()["id"]
    plain = c.post(f"/v1/jobs/echo/{echo}", json={"status": "succeeded", "attempt": 1})
    assert plain.status_code == 409 and "does not take status callbacks" in plain.json()["error"]
    assert (
        c.post("/v1/jobs/remote/nope", json={"status": "succeeded", "attempt": 1}).status_code
        == 404
    )
    bad = c.post(f"/v1/jobs/remote/{ok}", json={"status": "maybe", "attempt": 1})
    assert bad.status_code == 422 and "status" in bad.json()["error"]
