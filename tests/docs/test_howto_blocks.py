"""The how-to guides' code runs: each ```python block as a script from the checkout's root
(with the test's database and Redis prefix), each ```json chain through `hivejobs chain run`
with the example app that defines its job types."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs.test_readme import readme_blocks
from tests.harness import REDIS_URL, ROOT
from tests.process.cli import cli_env, hivejobs

# The guides run here, with the App their blocks use.
GUIDES = {"docs/howto/chains.md": "examples.myapp:app"}


@pytest.mark.parametrize("guide", sorted(GUIDES))
def test_guide_blocks_run(guide: str, tmp_path: Path, database_url: str, redis_prefix: str) -> None:
    blocks = readme_blocks((ROOT / guide).read_text(), guide)
    env = cli_env(
        HIVEJOBS_DATABASE_URL=database_url,
        HIVEJOBS_REDIS_URL=REDIS_URL,
        HIVEJOBS_PREFIX=redis_prefix,
        HIVEJOBS_APP=GUIDES[guide],
    )
    ran = 0
    for block in blocks:
        where = f"{guide}:{block.line}"
        if block.lang == "python":
            script = tmp_path / f"block_{block.line}.py"
            script.write_text(block.code + "\n")
            done = subprocess.run(
                [sys.executable, str(script)],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
        elif block.lang == "json":
            chain = tmp_path / f"block_{block.line}.json"
            chain.write_text(block.code)
            done = hivejobs(["chain", "run", str(chain)], env)
        else:
            assert block.lang == "text", f"{where}: ```{block.lang} is not run"
            continue
        assert done.returncode == 0, f"{where}\n{done.stdout}\n{done.stderr}"
        ran += 1
    assert ran >= 2
