"""Lines libraries log through the standard `logging` module reach our sink (setup_logging),
scrubbed like ours, unless the process's own code set up `logging`, before or after. Each
case runs in a process of its own: setup_logging configures the process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

SECRET = "s3cret-pw"
SCRIPT = f"""
import logging, sys
from hivejobs.config import remember_secrets
from hivejobs.logs import setup_logging
remember_secrets("postgresql://app:{SECRET}@db.internal/app")
setup_logging("pool:x#1")
if sys.argv[1] == "user-config":  # an app module imported after setup_logging, say
    logging.basicConfig(level=logging.INFO, format="user %(name)s %(message)s")
    logging.getLogger("myapp.jobs").info("resized %s", "a.png")
pool = logging.getLogger("psycopg.pool")
pool.info("connection given by %r", "hivejobs")  # a line per checkout: not routed
pool.warning("error connecting in %r: %s", "hivejobs", "password {SECRET} rejected {{x}}")
"""


def run(mode: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode],
        env={**os.environ, "HIVEJOBS_LOG_FORMAT": "json", "HIVEJOBS_LOG_LEVEL": "INFO"},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stderr


def test_a_library_warning_is_one_json_line_of_ours_without_the_password() -> None:
    lines = run("ours").splitlines()
    assert len(lines) == 1  # the INFO line stays below the library threshold
    record = json.loads(lines[0])["record"]
    assert record["level"]["name"] == "WARNING"
    assert record["extra"]["library"] == "psycopg.pool"
    assert record["extra"]["process"] == "pool:x#1"
    assert record["extra"]["text"].startswith("error connecting in 'hivejobs': password ")
    assert "{x}" in record["extra"]["text"]  # their text is a field, never a template
    assert SECRET not in lines[0]


def test_an_app_that_sets_up_logging_keeps_every_line_to_its_own_handlers() -> None:
    # psycopg keeps its own loggers at WARNING: the pool's INFO line stays out here too.
    assert run("user-config").splitlines() == [
        "user myapp.jobs resized a.png",
        "user psycopg.pool error connecting in 'hivejobs': password s3cret-pw rejected {x}",
    ]
