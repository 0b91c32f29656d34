"""A chain handler's context reads its chain through the store it is handed, never the App's."""

from __future__ import annotations

from collections.abc import Callable

import psycopg

from hivejobs import App, Chain, JobContext
from hivejobs.records.jobs import ClaimedJob
from hivejobs.store import Store
from hivejobs.store.chains import ChainStore


def test_context_reads_its_chain_through_the_pool_store_not_the_app(
    make_app: Callable[..., App], database_url: str
) -> None:
    """In a pool process the context gets the pool's ChainStore: the App it carries (whose
    store would be a second connection pool per process) is never opened. Here the App
    points at servers that do not exist, so any use of its store would raise."""
    app = make_app()

    @app.job("step")
    def step(ctx: JobContext, payload: None) -> None: ...

    chain = Chain("pair", args={"n": 1})
    first = chain.job("step", key="a")
    chain.job("step", key="b", after=[first])
    request_id = app.run_chain(chain)
    job_id = f"{request_id}:b:1"
    with psycopg.connect(database_url, autocommit=True) as conn:  # as the traverser does
        conn.execute(
            "UPDATE hivejobs_chain_job SET result = %s WHERE chain_id = %s AND key = %s",
            (b'"done"', request_id, "a"),
        )
        conn.execute(
            "UPDATE hivejobs_chain_job SET job_id = %s WHERE chain_id = %s AND key = %s",
            (job_id, request_id, "b"),
        )
    unreachable = App(
        database_url="postgresql://127.0.0.1:1/hivejobs", redis_url="redis://127.0.0.1:1/0"
    )
    job = ClaimedJob(
        id=job_id,
        name="step",
        attempt=1,
        attempts=1,
        delivery="at_least_once",
        payload=b"null",
        claim_token=1,
        priority=0,
    )
    pool_store = Store(database_url)
    try:
        ctx = JobContext(job, unreachable, ChainStore(pool_store))
        assert ctx.chain is not None
        assert (ctx.chain.request_id, ctx.chain.key, ctx.chain.args) == (request_id, "b", {"n": 1})
        assert ctx.upstream == {"a": "done"}
        assert unreachable.connections._store is None  # never opened
    finally:
        pool_store.close()
