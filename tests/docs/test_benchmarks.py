"""BENCHMARKS.md and the results it stands on agree: every result file it (or the README) cites
exists, every entry of bench/results/ is cited (an uncited result is linked or removed: git
keeps the history), and every section other pages send readers to by name is there."""

from __future__ import annotations

import itertools
import re

from tests.harness import ROOT

CITED = re.compile(r"bench/results/[\w.{},/-]+")
# A page sending its reader to a section: BENCHMARKS.md, "Many hosts, simulated"
SECTION_REFERENCE = re.compile(r'BENCHMARKS\.md(?:\]\(BENCHMARKS\.md\))?,? "([^"]+)"')
CITING = ["BENCHMARKS.md", "README.md"]


def expanded(path: str) -> list[str]:
    """`2026-12-05-sweep-{cpu,redis}.json` as the shell would read it."""
    parts = re.split(r"\{([^}]*)\}", path)
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(combo) for combo in itertools.product(*choices)]


def cited_results() -> set[str]:
    cited: set[str] = set()
    for doc in CITING:
        for match in CITED.findall((ROOT / doc).read_text()):
            for path in expanded(match.rstrip(".,")):
                cited.add(path.rstrip("/"))
    return cited


def test_every_cited_result_exists() -> None:
    for path in sorted(cited_results()):
        if path != "bench/results":
            assert (ROOT / path).exists(), f"{path} is cited but not in the tree"


def test_every_result_is_cited() -> None:
    cited = cited_results()
    for entry in sorted((ROOT / "bench/results").iterdir()):
        path = f"bench/results/{entry.name}"
        assert path in cited, f"{path} is cited by none of {CITING}: link it or remove it"


def test_sections_named_elsewhere_exist() -> None:
    headings = [
        line.lstrip("#").strip()
        for line in (ROOT / "BENCHMARKS.md").read_text().split("\n")
        if line.startswith("## ")
    ]
    pages = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "bench").rglob("*.md")]
    for page in pages:
        for found in SECTION_REFERENCE.findall(page.read_text()):
            name = " ".join(found.split())  # a name wrapped over two lines
            assert any(h.startswith(name) for h in headings), f"{page}: no section {name!r}"
