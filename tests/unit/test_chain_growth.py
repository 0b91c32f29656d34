"""plan_growth and the Growth builder: what a running chain job may add, decided from the
chain as stored (tables of snapshots, no servers)."""

from __future__ import annotations

from typing import Any

import pytest

from hivejobs.chains.growth import Growth, plan_growth
from hivejobs.errors import ChainInvalid
from hivejobs.store.chains import GrowthSnapshot, StoredJob

# root -> a (running, the adder) -> b -> c ;  root -> x (a sibling of a) ; s1 -> s2 a sequence
# below a.
STORED = [
    StoredJob("root", [], "succeeded", None, None),
    StoredJob("a", ["root"], "running", None, None),
    StoredJob("b", ["a"], "pending", None, None),
    StoredJob("c", ["b"], "pending", None, None),
    StoredJob("x", ["root"], "running", None, None),
    StoredJob("s1", ["a"], "pending", "s1", None),
    StoredJob("s2", ["s1"], "pending", "s1", None),
]


def snapshot(extra: tuple[StoredJob, ...] = ()) -> GrowthSnapshot:
    jobs = {j.key: j for j in (*STORED, *extra)}
    return GrowthSnapshot("0" * 32, "a", jobs)


def row(key: str, after: list[str]) -> dict[str, Any]:
    return {"key": key, "after": after}


def plan(
    rows: list[dict[str, Any]],
    before: dict[str, tuple[str, ...]] | None = None,
    extra: tuple[StoredJob, ...] = (),
) -> Any:
    befores = {r["key"]: () for r in rows} | (before or {})
    return plan_growth(snapshot(extra), rows, befores)


def test_fan_out_and_join_below_the_adder() -> None:
    rows = [row(f"a.{i}", []) for i in range(1, 4)] + [row("a.join", ["a.1", "a.2", "a.3"])]
    written = plan(rows, before={"a.join": ("b",)})
    assert [r["key"] for r in written.rows] == ["a.1", "a.2", "a.3", "a.join"]
    assert [r["after"] for r in written.rows[:3]] == [["a"], ["a"], ["a"]]  # default: the adder
    assert written.before == {"b": ["a.join"]}


@pytest.mark.parametrize(
    ("rows", "before", "message"),
    [
        # Edges out of the adder's part of the chain.
        ([row("a.1", ["x"])], {}, "after 'x', which is neither 'a' nor a job below it"),
        ([row("a.1", ["root"])], {}, "after 'root', which is neither 'a' nor a job below it"),
        ([row("a.1", ["nope"])], {}, "after 'nope', which is not a job of this chain"),
        ([row("a.1", [])], {"a.1": ("x",)}, "before 'x', which is neither 'a' nor a job below"),
        ([row("a.1", [])], {"a.1": ("a",)}, "before 'a', the job adding it, which already runs"),
        # A pending job in a sequence gets no second way in.
        ([row("a.1", [])], {"a.1": ("s2",)}, "before 's2', which is in a sequence"),
        # Cycles: among added jobs, and through a job below the adder.
        ([row("a.1", ["a.2"]), row("a.2", ["a.1"])], {}, "the added jobs make a cycle: a.1"),
        ([row("a.1", ["c"])], {"a.1": ("b",)}, "the added jobs make a cycle"),
    ],
)
def test_refused_growth_names_the_job_at_fault(
    rows: list[dict[str, Any]], before: dict[str, tuple[str, ...]], message: str
) -> None:
    with pytest.raises(ChainInvalid) as caught:
        plan(rows, before)
    assert message in str(caught.value)


def test_before_a_job_that_started_is_refused() -> None:
    started = StoredJob("d", ["a"], "succeeded", None, None)  # after a sequence retry of a
    with pytest.raises(ChainInvalid, match="before 'd', which has already started"):
        plan([row("a.1", [])], before={"a.1": ("d",)}, extra=(started,))


def test_keys_added_by_an_earlier_try_are_kept_and_only_the_others_added() -> None:
    earlier = StoredJob("a.1", ["a"], "succeeded", None, "a")
    written = plan([row("a.1", []), row("a.2", ["a.1"])], extra=(earlier,))
    assert [r["key"] for r in written.rows] == ["a.2"]


def test_a_key_taken_by_another_job_is_refused() -> None:
    declared = StoredJob("a.1", ["root"], "pending", None, None)
    with pytest.raises(ChainInvalid, match="already has a job of that key, not added by 'a'"):
        plan([row("a.1", [])], extra=(declared,))


def test_builder_keys_positions_and_field_checks() -> None:
    counter = iter(range(1, 100))
    growth = Growth("scan", lambda: next(counter))
    assert growth.job("step") == "scan.1"
    assert growth.job("step", name="file-x") == "scan.file-x"
    assert growth.job("step") == "scan.2"  # positions count unnamed jobs only
    with pytest.raises(ChainInvalid, match="adds two jobs named 'file-x'"):
        growth.job("step", name="file-x")
    with pytest.raises(ChainInvalid, match="name 'a b' must be 1-64 letters"):
        growth.job("step", name="a b")
    with pytest.raises(ChainInvalid, match="tries must be an integer >= 1"):
        growth.job("step", name="t", tries=0)
    with pytest.raises(ChainInvalid, match="after takes a list of job keys, not a string"):
        growth.job("step", name="s", after="scan.1")
    with pytest.raises(ChainInvalid, match="over 200 characters"):
        Growth("k" * 190, lambda: 1).job("step", name="n" * 20)
    assert growth.job("step", name="twice", after=["scan.1", "scan.1"]) == "scan.twice"
    assert growth.jobs["scan.twice"].after == ("scan.1",)  # one edge
    assert list(growth.jobs) == ["scan.1", "scan.file-x", "scan.2", "scan.twice"]
