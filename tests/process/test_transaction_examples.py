"""The README's transactional-enqueue examples run as a user would run them, on a fresh
database: the committed job is stored, the rolled-back one is not."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.harness import ROOT

EXAMPLES = {
    "psycopg_sync": 1,
    "psycopg_async": 1,
    "sqlalchemy_orm": 2,  # a Session and an AsyncSession
    "django_view": 1,
}


@pytest.mark.parametrize("module", sorted(EXAMPLES))
def test_example_commits_one_job_and_rolls_back_the_other(
    module: str, instance_env: dict[str, str]
) -> None:
    env = {**instance_env, "DJANGO_SETTINGS_MODULE": "examples.transactions.django_settings"}
    done = subprocess.run(
        [sys.executable, "-m", f"examples.transactions.{module}"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if "committed" in line]
    assert len(lines) == EXAMPLES[module], done.stdout
    assert all(": queued;" in line and "rolled back" in line for line in lines), done.stdout
