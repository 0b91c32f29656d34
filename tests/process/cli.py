"""The real `hivejobs` CLI as a subprocess, with a clean environment (no inherited URLs)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import redis

from tests.harness import ROOT, free_port, wait_until


def cli_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("HIVEJOBS_") and k not in ("DATABASE_URL", "REDIS_URL")
    }
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT)])
    env["HIVEJOBS_EMBEDDED"] = "0"  # never start servers behind a test's back
    env.update(extra)
    return env


def hivejobs(
    args: Sequence[str | bytes], env: dict[str, str], timeout: float = 60.0
) -> subprocess.CompletedProcess[str]:
    """Run the CLI; stdout and stderr decoded with replacement (bytes we did not expect)."""
    done = subprocess.run(
        [sys.executable, "-m", "hivejobs", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        timeout=timeout,
        check=False,
    )
    return subprocess.CompletedProcess(
        done.args,
        done.returncode,
        done.stdout.decode("utf-8", "replace"),
        done.stderr.decode("utf-8", "replace"),
    )


class PasswordRedis:
    """redis-server on a free port that requires `password` (no persistence)."""

    def __init__(self, folder: Path, password: str) -> None:
        self.port = free_port()
        self.password = password
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
            + ["--appendonly", "no", "--dir", str(folder), "--requirepass", password],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(port=self.port, password=password, socket_timeout=1)

        def answers() -> bool:
            try:
                return bool(client.ping())
            except redis.RedisError:
                return False

        wait_until(answers, timeout=10, what="redis-server with a password")
        client.close()

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(10)
