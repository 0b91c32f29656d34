"""rickover's status callbacks end to end: `hivejobs run` hands `remote` jobs (a `def`
handler) and `aremote` jobs (its `async def` twin) to a second process
(tests/apps/other_service.py) that reports each attempt over HTTP to `hivejobs serve`."""

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

WITH_AREMOTE = {"HJ_AREMOTE": "1"}
KIND = {"remote": "def", "aremote": "async"}


@pytest.fixture
def server(start_server: Callable[..., Server]) -> Server:
    """`hivejobs serve` of the web app with its `aremote` type."""
    return start_server(env=WITH_AREMOTE)


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
    answering = fleet(WITH_AREMOTE)
    c = server.client
    types: dict[str, str] = {}  # job id -> its type

    def enqueue(plan: list[str], name: str = "remote") -> str:
        r = c.post(f"/v1/jobs/{name}", json={"data": {"plan": plan}})
        assert r.status_code == 201
        types[r.json()["id"]] = name
        return str(r.json()["id"])

    def job(job_id: str) -> dict[str, object]:
        return dict(c.get(f"/v1/jobs/{types[job_id]}/{job_id}").json())

    def ended(job_id: str) -> bool:
        return job(job_id)["state"] in ("succeeded", "failed", "cancelled")

    def handed(job_id: str) -> list[str]:
        """The attempts handed over, each checked to be its type's handler's kind."""
        lines = [p.split() for p in (ledger_dir / f"handed.{job_id}").read_text().splitlines()]
        assert all(p[1:] == [types[job_id], KIND[types[job_id]]] for p in lines), lines
        return [p[0] for p in lines]

    # Each outcome with a `def` handler and with an `async def` one.
    ok, aok = enqueue(["succeed"]), enqueue(["succeed"], "aremote")
    retried = enqueue(["fail_retry", "succeed"])
    aretried = enqueue(["fail_retry", "succeed"], "aremote")
    failed, afailed = enqueue(["fail"]), enqueue(["fail"], "aremote")
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
    for job_id in (ok, retried, failed, aok, aretried, afailed):
        wait_until(lambda j=job_id: ended(j), timeout=60, what=f"job {job_id} to end")
    answering.signal_group(signal.SIGTERM)
    assert answering.wait(30) == 0

    fleet({"HJ_CALLBACK_TIMEOUT_S": "1", **WITH_AREMOTE})
    timed_out = enqueue(["ignore", "ignore", "ignore"])
    atimed_out = enqueue(["ignore", "ignore", "ignore"], "aremote")
    for job_id in (timed_out, atimed_out):
        wait_until(lambda j=job_id: ended(j), timeout=60, what=f"job {job_id} to end")

    for ok_, retried_, failed_, timed_out_ in (
        (ok, retried, failed, timed_out),
        (aok, aretried, afailed, atimed_out),
    ):
        assert (job(ok_)["state"], job(ok_)["attempt"]) == ("succeeded", 1)
        assert handed(ok_) == ["1"]
        assert (job(retried_)["state"], job(retried_)["attempt"]) == ("succeeded", 2)
        assert handed(retried_) == ["1", "2"]
        assert (job(failed_)["state"], job(failed_)["error"]) == ("failed", "callback: failed")
        assert (job(timed_out_)["state"], job(timed_out_)["attempt"]) == ("failed", 3)
        assert job(timed_out_)["error"] == "callback timed out"
        assert handed(timed_out_) == ["1", "2", "3"]
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
