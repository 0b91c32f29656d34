"""The mutation check's list of guards (bench/mutants.py) stays true to the code: each
guard's text occurs exactly once in its file, its mutant differs, and the tests named for it
exist. A guard that moved or was renamed fails here at once, not at the weekly mutation run."""

from __future__ import annotations

import pytest
from bench.mutants import GUARDS, ROOT, Guard, occurrences


def test_the_guards_have_distinct_names() -> None:
    names = [g.name for g in GUARDS]
    assert len(names) == len(set(names))
    assert len(names) >= 15


@pytest.mark.parametrize("guard", GUARDS, ids=[g.name for g in GUARDS])
def test_each_guard_text_occurs_exactly_once_and_its_tests_exist(guard: Guard) -> None:
    assert occurrences(guard) == 1, f"{guard.name}: {guard.find!r} in {guard.path}"
    assert guard.replace != guard.find
    assert guard.tests
    for test in guard.tests:
        path, _, name = test.partition("::")
        source = (ROOT / path).read_text()
        if name:
            function = name.split("[")[0]
            assert f"def {function}(" in source, f"{guard.name}: no {function} in {path}"
