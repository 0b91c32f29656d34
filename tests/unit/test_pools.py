"""`pool=`: the checks at registration, the grouping into processes, the connection bound."""

from __future__ import annotations

import pytest

from hivejobs import App, InvalidJobType, JobContext
from hivejobs.broker.channels import ControlMessage
from hivejobs.worker.liveness import restart_applies
from hivejobs.worker.placement import footprint, pool_groups, store_size


def handler(ctx: JobContext, payload: object) -> None:
    return None


def small_app(*names: str, **options: object) -> App:
    app = App()
    for name in names:
        app.job(name, pool="small", **options)(handler)  # type: ignore[arg-type]
    return app


@pytest.mark.parametrize(
    ("first", "second", "message"),
    [
        (
            {"max_rss_mb": 500},
            {"max_rss_mb": 600},
            "job type 'b' joins pool 'small' with max_rss_mb=600.0, but 'a' in that pool has "
            "max_rss_mb=500.0",
        ),
        ({"max_rss_mb": 500}, {}, "with max_rss_mb=None, but 'a' in that pool has"),
        ({}, {"processes": 2}, "with processes=2, but 'a' in that pool has processes=1"),
    ],
)
def test_conflicting_process_options_in_one_pool_are_refused(
    first: dict[str, object], second: dict[str, object], message: str
) -> None:
    app = App()
    app.job("a", pool="small", **first)(handler)  # type: ignore[arg-type]
    with pytest.raises(InvalidJobType, match=message):
        app.job("b", pool="small", **second)  # type: ignore[arg-type]
    assert list(app.types) == ["a"]


def test_per_type_options_may_differ_within_a_pool() -> None:
    app = App()
    app.job("a", pool="small", concurrency=1, delivery="at_most_once")(handler)
    app.job("b", pool="small", concurrency=5, timeout=3.0, global_concurrency=2)(handler)
    assert [(jt.pool, jt.concurrency) for jt in app.types.values()] == [("small", 1), ("small", 5)]


@pytest.mark.parametrize(
    ("registered", "name", "pool", "message"),
    [
        ([], "a", "", "pool name '' must be 1-64 letters"),
        ([], "a", "no spaces", "pool name 'no spaces' must be"),
        ([], "a", "a", "pool 'a' has the name of job type 'a'"),
        (["solo"], "a", "solo", "pool 'solo' has the name of job type 'solo'"),
        (["x"], "small", None, "job type 'small' has the name of the pool 'small' of x"),
    ],
)
def test_pool_names_are_checked(
    registered: list[str], name: str, pool: str | None, message: str
) -> None:
    app = App()
    for other in registered:
        app.job(other, pool="small" if other == "x" else None)(handler)
    with pytest.raises(InvalidJobType, match=message):
        app.job(name, pool=pool)
    assert name not in app.types


def test_types_of_a_pool_are_one_process_and_the_bound_adds_up() -> None:
    app = small_app("a", "b", "c")
    app.job("solo", processes=2)(handler)
    groups = pool_groups(app.types.values())
    assert [(g.name, g.types, g.processes, g.shared) for g in groups] == [
        ("small", ("a", "b", "c"), 1, True),
        ("solo", ("solo",), 2, False),
    ]
    size = footprint(groups, coordinator=True)
    # Supervisor 1, coordinator 4, pool small (store 5 + App 4), two solo (store 3 + App 4).
    assert size.postgres_connections_max == 1 + 4 + 9 + 2 * 7
    assert size.processes == 1 + 1 + 1 + 2
    assert size.formula == "1 supervisor + 4 coordinator + 9 pool small (3 types) + 2 x 7 solo"
    assert footprint(groups, coordinator=False).postgres_connections_max == 1 + 9 + 2 * 7


def test_a_shared_store_grows_with_its_types_up_to_a_cap() -> None:
    assert [store_size(n) for n in (1, 2, 3, 4, 5, 30)] == [3, 4, 5, 6, 6, 6]


def test_a_restart_may_name_the_pool_or_any_of_its_types() -> None:
    names = {"small", "a", "b"}
    assert restart_applies(ControlMessage(action="restart", pool="small"), names)
    assert restart_applies(ControlMessage(action="restart", pool="b"), names)
    assert restart_applies(ControlMessage(action="restart"), names)
    assert not restart_applies(ControlMessage(action="restart", pool="solo"), names)
