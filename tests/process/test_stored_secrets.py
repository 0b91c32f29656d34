"""Stored texts follow the log sink's rule: a real `hivejobs run` whose handlers raise, return,
print and report their database URL keeps the password out of every table (errors,
tracebacks, results, chain statuses, captured output), as its log does."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from hivejobs import App
from hivejobs.chains import Chain
from tests.harness import Instance, sql, wait_until

MARK = "pw-c5e1a7b3-marker"
APP = "tests.apps.secretapp:app"


def every_row_text(url: str) -> str:
    tables = sql(url, "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
    rows = []
    for (table,) in tables:
        rows += [r[0] for r in sql(url, f"SELECT t::text FROM {table} t")]  # noqa: S608
    return "\n".join(rows)


def test_no_stored_text_keeps_the_password(
    start_instance: Callable[..., Instance],
    make_app: Callable[..., App],
    database_url: str,
    redis_prefix: str,
    tmp_path: Path,
) -> None:
    user, rest = database_url.split("://", 1)[1].split("@", 1)
    secret_url = f"postgresql://{user}:{MARK}@{rest}"  # trust auth: any password connects
    start_instance({"HIVEJOBS_DATABASE_URL": secret_url}, app_spec=APP)
    app = make_app()
    for name in ("raises", "returns", "talks"):
        app.job(name)(lambda ctx, payload: None)
    ids = [app.enqueue("raises", {}), app.enqueue("returns", {})]
    chain = Chain("leaky")
    chain.job("talks", {}, key="talks")
    chain_id = app.run_chain(chain)

    def finished() -> bool:
        states = {app.get_job(i).state for i in ids}
        return states <= {"failed", "succeeded"} and app.chain_status(chain_id).state == "failed"

    wait_until(finished, timeout=60, what="the jobs and the chain to end")
    assert app.get_job(ids[0]).attempt > 1  # a retry's error was stored, then the traceback
    stored = every_row_text(database_url)
    for text in ("cannot connect to", "connecting to", "warning: ", "on postgresql", "lost "):
        assert text in stored, text  # the texts are stored, the password in them is not
    assert MARK not in stored
    assert "***" in str(app.get_job(ids[1]).result)
