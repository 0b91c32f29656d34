"""procrastinate driver: Postgres (psycopg 3), 2 ``procrastinate worker`` processes with
``--concurrency 8`` each, LISTEN/NOTIFY on (the default), async task. Bulk = batch_defer."""

from __future__ import annotations

import os
import sys
from importlib.metadata import version
from pathlib import Path

import _common
import procrastinate

if __name__ == "__main__":
    ARGS = _common.parse_args(needs_pg=True)  # sets PEERS_PG_URL before the app below is built

app = procrastinate.App(
    connector=procrastinate.PsycopgConnector(conninfo=os.environ[_common.PG_URL_ENV])
)


@app.task(name="noop", queue="bench")
async def noop(t: float) -> None:
    """The job: the asyncio body (sync: the blocking one in a thread), then the counter."""
    await _common.ajob(t)


def main(args) -> None:
    body = _common.chosen_body(("async", "sync"))  # asyncio: its own body is async
    _common.install_sigterm()

    def start_workers(w: _common.Workers) -> None:
        exe = str(Path(sys.executable).parent / "procrastinate")
        for i in range(2):
            w.start(
                [
                    exe,
                    "--app",
                    "procrastinate_driver.app",
                    "worker",
                    "--name",
                    f"w{i}",
                    "--queues",
                    "bench",
                    "--concurrency",
                    "8",
                ]
            )

    with app.open():
        app.schema_manager.apply_schema()
        result = _common.run_workload(
            args,
            system="procrastinate",
            version=version("procrastinate"),
            keeps_jobs_in="Postgres",
            enqueue_one=lambda t: noop.defer(t=t),
            enqueue_bulk=lambda ts: noop.batch_defer(*({"t": t} for t in ts)),
            start_workers=start_workers,
            settings="psycopg3, 2 x `procrastinate worker --concurrency 8`, listen/notify, "
            f"{_common.BODY_LABEL[body]}",
        )
    _common.emit(result)


if __name__ == "__main__":
    main(ARGS)
