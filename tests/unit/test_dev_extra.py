"""`pip install -e '.[dev]'` (the README's and the tutorial's install line) brings every tool
their commands then run: a fresh machine has no pytest of its own."""

from __future__ import annotations

import re
import tomllib

from tests.harness import ROOT

# A command the docs tell a newcomer to run, and the distribution that provides it.
TOOLS = {"pytest": "pytest"}
COMMAND = re.compile(r"(?:^|`|\$ |&& )(?P<tool>" + "|".join(TOOLS) + r") ", re.M)
DOCS = ["README.md", "docs/tutorial.md", "docs/howto/testing.md"]


def _dev_distributions() -> set[str]:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    dev = extras["optional-dependencies"]["dev"]
    return {re.split(r"[<>=!~\[ ;]", spec, maxsplit=1)[0].lower() for spec in dev}


def test_dev_extra_brings_the_tools_the_docs_run() -> None:
    used = {m["tool"]: doc for doc in DOCS for m in COMMAND.finditer((ROOT / doc).read_text())}
    assert "pytest" in used, "the docs no longer run pytest: update this test"
    missing = {tool: doc for tool, doc in used.items() if TOOLS[tool] not in _dev_distributions()}
    assert not missing, f"run in the docs but not in [dev]: {missing}"
