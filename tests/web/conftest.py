"""Web tests: a real `hivejobs serve` (uvicorn in a subprocess) over a test database, and the
worker fleet (`hivejobs run tests.apps.webapp:app`) where a test needs jobs to run."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.harness import ROOT, Instance, free_port, wait_until
from tests.process.cli import cli_env, hivejobs

ADMIN = "admin-token-for-tests"
READER = "read-token-for-tests"
WEBAPP = "tests.apps.webapp:app"


class Server:
    """`python -m hivejobs serve` in its own session; `client` sends the admin token."""

    def __init__(self, env: dict[str, str], log: Path, args: list[str]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = open(log, "ab")  # noqa: SIM115 - closed in stop()
        self.log_path = log
        cmd = [sys.executable, "-m", "hivejobs", "serve", *args, "--port", str(self.port)]
        self.proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.client = httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10
        )
        wait_until(self._up, timeout=30, what=f"hivejobs serve on {self.port}")

    def _up(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError("serve exited:\n" + self.log_path.read_text())
        try:
            return self.client.get("/healthz").status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        self.client.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()


@pytest.fixture
def web_env(instance_env: dict[str, str]) -> dict[str, str]:
    env = dict(instance_env)
    env["HIVEJOBS_ADMIN_TOKENS"] = ADMIN
    env["HIVEJOBS_READ_TOKENS"] = READER
    env["HIVEJOBS_LOG_LEVEL"] = "WARNING"
    return env


@pytest.fixture
def start_server(web_env: dict[str, str], tmp_path: Path) -> Iterator[Callable[..., Server]]:
    servers: list[Server] = []

    def start(args: list[str] | None = None, env: dict[str, str] | None = None) -> Server:
        server = Server(
            {**web_env, **(env or {})}, tmp_path / f"serve{len(servers)}.log", args or [WEBAPP]
        )
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def server(start_server: Callable[..., Server]) -> Server:
    return start_server()


@pytest.fixture
def fleet(
    start_instance: Callable[..., Instance], web_env: dict[str, str]
) -> Callable[..., Instance]:
    """`hivejobs run tests.apps.webapp:app`, ready once its pools heartbeat."""

    def start(extra_env: dict[str, str] | None = None, args: list[str] | None = None) -> Instance:
        env = {k: v for k, v in web_env.items() if k.startswith(("HJ_", "HIVEJOBS_"))}
        return start_instance(extra_env={**env, **(extra_env or {})}, args=args, app_spec=WEBAPP)

    return start


def flow_cli(web_env: dict[str, str], *args: str) -> str:
    """`hivejobs pause|resume NAME` on the web tests' database, with the web app's types;
    its one line of output."""
    hj = {k: v for k, v in web_env.items() if k.startswith("HIVEJOBS_")}
    done = hivejobs(list(args), cli_env(**hj, HIVEJOBS_APP=WEBAPP))
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()
