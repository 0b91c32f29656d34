"""TLS and auth everywhere, with a throwaway CA made by the test: a real `hivejobs run` on a
Postgres of the test's own that takes client-certificate TLS only (`sslmode=verify-full`)
and a redis-server that answers on TLS only, client certificates required, as an ACL user
(the default user is off). Every server connection of the fleet is TLS; no job is lost.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import psycopg

from hivejobs import App
from tests.harness import FAST_SETTINGS, Instance, ledger_oks, ledger_starts, sql, wait_until
from tests.servers import ThrowawayCA, TlsRedis, tls_postgres


def test_run_over_tls_with_client_certificates_and_an_acl_user(
    start_instance: Callable[..., Instance], tmp_path: Path, ledger_dir: Path
) -> None:
    ca = ThrowawayCA(tmp_path / "ca")
    server, template = tls_postgres(ca)
    tls_redis = TlsRedis(tmp_path / "redis", ca)
    prefix = f"hjtls:{uuid.uuid4().hex[:8]}:"
    database_url = template.format(db="hj")
    app = App(
        database_url=database_url,
        redis_url=tls_redis.url,
        prefix=prefix,
        testing=None,
        **FAST_SETTINGS,
    )
    try:
        app.migrate()  # creates the database, over TLS
        start_instance(
            {
                "HIVEJOBS_DATABASE_URL": database_url,
                "HIVEJOBS_REDIS_URL": tls_redis.url,
                "HIVEJOBS_PREFIX": prefix,
                "HJ_TYPES": "alo,amo",
            }
        )
        wait_until(
            lambda: (
                sql(database_url, "SELECT count(*) FROM hivejobs_worker WHERE role = 'pool'")[0][0]
                >= 2
            ),
            what="pools up",
        )
        alo = app.enqueue_many("alo", [{"ms": 2}] * 300)
        amo = [app.enqueue("amo", {"ms": 1}) for _ in range(50)]
        with psycopg.connect(database_url) as conn:
            alo += [app.enqueue("alo", {"ms": 1}, conn=conn) for _ in range(20)]
        wait_until(
            lambda: all(ledger_oks(ledger_dir)[i] for i in alo + amo),
            timeout=60,
            what="every job to run",
        )
        assert [i for i in amo if ledger_starts(ledger_dir)[i] != 1] == []
        plain = sql(
            database_url,
            "SELECT count(*), count(*) FILTER (WHERE NOT s.ssl) FROM pg_stat_activity a "
            "JOIN pg_stat_ssl s USING (pid) WHERE a.backend_type = 'client backend' "
            "AND a.datname = 'hj'",
        )[0]
        assert plain[0] >= 4 and plain[1] == 0, plain  # the fleet's connections, all TLS
    finally:
        app.close()
        tls_redis.stop()
        server.close()
