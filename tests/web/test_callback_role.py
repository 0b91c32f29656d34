"""The callback role: a token that may post one job type's status callbacks and nothing else,
and a per-type secret whose HMAC of the body every callback of that type must carry. Against
a real `hivejobs serve` and a `hivejobs run` that hands `remote` jobs over."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable
from pathlib import Path

import httpx

from tests.harness import Instance, wait_until
from tests.web.conftest import Server

CALLBACK = "callback-token-for-remote-jobs"
SECRET = "hmac-key-of-remote-callbacks"
MARK = "pw-9b1f2e77-marker"


def signed(body: bytes, key: str = SECRET) -> dict[str, str]:
    mac = hmac.new(key.encode(), body, hashlib.sha256).hexdigest()
    return {"X-Hivejobs-Signature": f"sha256={mac}", "content-type": "application/json"}


def test_a_callback_token_posts_its_types_callbacks_and_nothing_else(
    start_server: Callable[..., Server], fleet: Callable[..., Instance], ledger_dir: Path
) -> None:
    server = start_server(
        env={
            "HIVEJOBS_CALLBACK_TOKENS": f"remote:{CALLBACK}",
            "HIVEJOBS_CALLBACK_SECRETS": f"remote:{SECRET}",
        }
    )
    fleet()
    admin = server.client
    job_id = admin.post("/v1/jobs/remote", json={"data": {}}).json()["id"]
    echo_id = admin.post("/v1/jobs/echo", json={"data": {"text": "a"}}).json()["id"]
    wait_until(lambda: (ledger_dir / f"handed.{job_id}").exists(), what="the hand-over")
    body = b'{"status": "succeeded", "attempt": 1}'
    cb = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {CALLBACK}"})
    with cb:
        for method, path in [
            ("GET", f"/v1/jobs/remote/{job_id}"),
            ("POST", "/v1/jobs/remote"),
            ("PUT", "/v1/jobs/remote/mine"),
            ("POST", "/v1/jobs/remote/batch"),
            ("DELETE", f"/v1/jobs/remote/{job_id}"),
            ("POST", f"/v1/jobs/remote/{job_id}/replay"),
            ("POST", f"/v1/jobs/echo/{echo_id}"),  # another type's callback
            ("GET", "/v1/jobs?state=failed"),
            ("POST", "/v1/bulk"),
            ("POST", "/v1/chains"),
            ("GET", "/v1/chains"),
            ("POST", "/v1/jobtypes/remote/pause"),
            ("PUT", "/v1/jobtypes/remote/concurrency"),
            ("GET", "/v1/jobtypes"),
            ("GET", "/v1/workers"),
            ("GET", "/metrics"),
            ("GET", "/dashboard"),
        ]:
            r = cb.request(method, path, content=body, headers=signed(body))
            assert r.status_code == 403, (method, path, r.status_code, r.text)
        path = f"/v1/jobs/remote/{job_id}"
        unsigned = cb.post(path, content=body, headers={"content-type": "application/json"})
        assert unsigned.status_code == 401 and "X-Hivejobs-Signature" in unsigned.text
        forged = cb.post(path, content=body, headers=signed(body, key="guessed"))
        assert forged.status_code == 401
        # The signature binds the body: a valid one for another body does not carry over.
        other = b'{"status": "failed", "attempt": 1}'
        assert cb.post(path, content=other, headers=signed(body)).status_code == 401
        # Even an admin's callback of this type needs the signature.
        admin_unsigned = admin.post(
            path, content=body, headers={"content-type": "application/json"}
        )
        assert admin_unsigned.status_code == 401
        assert admin.get(path).json()["state"] == "running"
        done = cb.post(path, content=body, headers=signed(body))
        assert done.status_code == 200, done.text
    assert admin.get(path).json()["state"] == "succeeded"


def test_a_callback_error_is_stored_without_the_servers_password(
    start_server: Callable[..., Server],
    fleet: Callable[..., Instance],
    ledger_dir: Path,
    database_url: str,
) -> None:
    """The reporting service echoes the DSN it was handed: stored as `***`, as in the log."""
    user, rest = database_url.split("://", 1)[1].split("@", 1)
    secret_url = f"postgresql://{user}:{MARK}@{rest}"  # trust auth: any password connects
    server = start_server(env={"HIVEJOBS_DATABASE_URL": secret_url})
    fleet()
    job_id = server.client.post("/v1/jobs/remote", json={"data": {}}).json()["id"]
    wait_until(lambda: (ledger_dir / f"handed.{job_id}").exists(), what="the hand-over")
    error = f"could not reach {secret_url}"
    body = {"status": "failed", "attempt": 1, "error": error}
    answer = server.client.post(f"/v1/jobs/remote/{job_id}", json=body)
    assert answer.status_code == 200, answer.text
    stored = server.client.get(f"/v1/jobs/remote/{job_id}").json()["error"]
    assert MARK not in stored and f"{user}:***@" in stored
