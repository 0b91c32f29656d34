"""HIVEJOBS_READ_DATABASE_URL: listings read from their own URL (a replica in production),
writes and the reads that decide them stay on the primary's."""

from __future__ import annotations

from hivejobs import App, JobContext
from tests.harness import FAST_SETTINGS, REDIS_URL, sql


def test_listings_use_the_read_url(database_url: str, redis_prefix: str) -> None:
    read_url = f"{database_url}?application_name=hj-read"
    app = App(
        database_url=database_url,
        redis_url=REDIS_URL,
        prefix=redis_prefix,
        read_database_url=read_url,
        testing=None,
        **FAST_SETTINGS,
    )

    @app.job("report")
    def report(ctx: JobContext, payload: dict[str, int]) -> None: ...

    try:
        app.connections.store.upsert_job_types([t.info() for t in app.types.values()])
        job_id = app.enqueue("report", {"n": 1})
        assert app.get_job(job_id).state == "queued"  # from the primary
        counts = {c.name: c for c in app.connections.read_store.type_counts()}
        assert counts["report"].queued == 1
        assert app.list_chains(5) == []
        readers = sql(
            database_url,
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name = 'hj-read'",
        )
        assert readers[0][0] >= 1
        assert app.connections.read_store is not app.connections.store
    finally:
        app.close()
