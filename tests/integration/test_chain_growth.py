"""ctx.chain.add against real Postgres: what a running try adds is stored whole or not at all,
a second add of the same keys (a re-run after a kill) adds nothing, and bad input is refused
with the job and field named and nothing stored."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
import pytest

from hivejobs import App, Chain, JobContext
from hivejobs.chains import Growth
from hivejobs.chains.render import render
from hivejobs.coordinator.traverser import Traverser
from hivejobs.errors import ChainInvalid
from hivejobs.store import new_worker_id
from hivejobs.store.chains import ChainStore
from tests.harness import sql
from tests.integration.test_coordinator import leader


class Size(msgspec.Struct):
    width: int


def running_root(app: App) -> tuple[str, Callable[[], JobContext]]:
    """A chain root -> b -> c with `root` claimed by a pool; returns its id and a maker of
    contexts for that try (each one a fresh view, as a re-run of the handler has)."""

    @app.job("step")
    def step(ctx: JobContext, payload: Any) -> None: ...

    @app.job("resize")
    def resize(ctx: JobContext, payload: Size) -> None: ...

    app.connections.store.upsert_job_types([app.types[t].info() for t in ("step", "resize")])
    chain = Chain("grows")
    root = chain.job("step", key="root")
    b = chain.job("step", key="b", after=[root])
    chain.job("step", key="c", after=[b])
    request_id = app.run_chain(chain)
    Traverser(app.connections.store, app.connections.broker).run_once(leader(app))
    with app.connections.store.connection() as conn:
        (claimed,) = app.connections.store.claim_queued(
            [f"{request_id}:root:1"], new_worker_id(), conn, name="step"
        )
    return request_id, lambda: JobContext(claimed, app, ChainStore(app.connections.store))


def stored(database_url: str, request_id: str) -> list[tuple[Any, ...]]:
    """Everything a growth may write: the chain's job rows and its job count."""
    rows = sql(
        database_url,
        "SELECT key, name, after_keys, added_by FROM hivejobs_chain_job "
        "WHERE chain_id = %s ORDER BY key",
        (request_id,),
    )
    count = sql(database_url, "SELECT jobs FROM hivejobs_chain WHERE id = %s", (request_id,))
    return [*rows, *count]


def grow(ctx: JobContext) -> Growth:
    assert ctx.chain is not None
    return ctx.chain.grow()


def test_fan_out_stored_whole_once_and_shown(
    make_app: Callable[..., App], database_url: str
) -> None:
    app = make_app()
    request_id, context = running_root(app)
    ctx = context()
    more = grow(ctx)
    parts = [more.job("resize", {"width": i}) for i in range(3)]
    more.job("step", name="join", after=parts, before=["c"])
    assert ctx.chain is not None
    assert ctx.chain.add(more) == ["root.1", "root.2", "root.3", "root.join"]

    status = app.chain_status(request_id)
    jobs = {j.key: j for j in status.jobs}
    assert {k: (j.after, j.added_by) for k, j in jobs.items() if j.added_by} == {
        "root.1": (["root"], "root"),
        "root.2": (["root"], "root"),
        "root.3": (["root"], "root"),
        "root.join": (["root.1", "root.2", "root.3"], "root"),
    }
    assert jobs["c"].after == ["b", "root.join"]
    assert "(added by root)" in render(status)
    assert app.list_chains()[0].jobs == 7

    # The handler run again (a new try's view, positions from 1): nothing added twice.
    before = stored(database_url, request_id)
    again = context()
    more = grow(again)
    parts = [more.job("resize", {"width": i}) for i in range(3)]
    more.job("step", name="join", after=parts, before=["c"])
    more.job("step", name="late", after=["root.join"])
    assert again.chain is not None
    assert again.chain.add(more) == ["root.late"]
    after = stored(database_url, request_id)
    assert [r for r in after if r not in before] == [
        ("root.late", "step", ["root.join"], "root"),
        (8,),
    ]
    assert [r for r in before if r not in after] == [(7,)]


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda g: g.job("nope"), "job 'root.1': unknown job type 'nope'"),
        (lambda g: g.job("resize", {"width": "wide"}), "Expected `int`, got `str` - at `$.width`"),
        (lambda g: g.job("step", after=["root"], before=["root"]), "the job adding it"),
        (lambda g: g.job("step", after=["nowhere"]), "after 'nowhere', which is not a job"),
        (
            lambda g: [
                g.job("step", name="x", after=["root.y"]),
                g.job("step", name="y", after=["root.x"]),
            ],
            "cycle",
        ),
        (lambda g: g.job("step", after=["c"], before=["b"]), "cycle: "),
        (lambda g: g.job("step", name="b2", priority=12), "priority must be an integer 0-9"),
    ],
)
def test_bad_growth_refused_whole_with_nothing_stored(
    make_app: Callable[..., App],
    database_url: str,
    build: Callable[[Growth], object],
    message: str,
) -> None:
    app = make_app()
    request_id, context = running_root(app)
    before = stored(database_url, request_id)
    ctx = context()
    more = grow(ctx)
    more.job("resize", {"width": 1}, name="good")  # a valid job in the same growth
    build(more)
    assert ctx.chain is not None
    with pytest.raises(ChainInvalid) as caught:
        ctx.chain.add(more)
    assert message in str(caught.value)
    assert stored(database_url, request_id) == before


def test_a_try_that_no_longer_runs_adds_nothing(
    make_app: Callable[..., App], database_url: str
) -> None:
    app = make_app()
    request_id, context = running_root(app)
    ctx = context()
    # The try was abandoned (a stop past its timeout) or rescued: its job row is archived.
    sql(
        database_url,
        "UPDATE hivejobs_job SET state = 'queued', worker_id = NULL WHERE id = %s",
        (ctx.job_id,),
    )
    before = stored(database_url, request_id)
    more = grow(ctx)
    more.job("step")
    assert ctx.chain is not None
    with pytest.raises(ChainInvalid, match="this try no longer runs"):
        ctx.chain.add(more)
    assert stored(database_url, request_id) == before
