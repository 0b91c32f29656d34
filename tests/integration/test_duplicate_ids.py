"""S7 (storage part): the same ids enqueued concurrently from many threads store each job once."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from hivejobs import App, JobIdConflict
from tests.harness import sql


def test_sixteen_concurrent_enqueues_per_id_store_one_job(
    make_app: Callable[..., App], database_url: str
) -> None:
    app = make_app()

    @app.job("dup")
    def dup(ctx: object, payload: dict[str, int]) -> None: ...

    ids = [f"order-{i}" for i in range(300)]
    returned: list[str] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def client() -> None:
        mine = []
        try:
            for i, job_id in enumerate(ids):
                mine.append(app.enqueue("dup", {"n": i}, id=job_id))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        with lock:
            returned.extend(mine)

    threads = [threading.Thread(target=client) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    assert sorted(returned) == sorted(ids * 16)  # every duplicate call returned the same id
    assert sql(database_url, "SELECT count(*) FROM hivejobs_job")[0][0] == 300

    before = sql(database_url, "SELECT id, payload FROM hivejobs_job ORDER BY id")
    for job_id in ids[:20]:
        with pytest.raises(JobIdConflict):
            app.enqueue("dup", {"n": -1}, id=job_id)
    assert sql(database_url, "SELECT id, payload FROM hivejobs_job ORDER BY id") == before
