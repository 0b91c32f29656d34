"""pgqueuer driver: Postgres via asyncpg, 2 ``pgq run`` processes with ``--batch-size 10
--max-concurrent-tasks 20`` (LISTEN/NOTIFY wake-ups, its default), an ``async def``
entrypoint. Bulk = ``Queries.enqueue`` with lists."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.metadata import version
from pathlib import Path

import _common
import asyncpg
from pgqueuer import AsyncpgDriver, Job, PgQueuer, Queries


@asynccontextmanager
async def create_pgqueuer() -> AsyncIterator[PgQueuer]:
    """Factory for ``pgq run``: one asyncpg connection per worker process."""
    conn = await asyncpg.connect(os.environ[_common.PG_URL_ENV])
    pgq = PgQueuer(AsyncpgDriver(conn))

    @pgq.entrypoint("noop")
    async def noop(job: Job) -> None:
        """The job: the asyncio body (sync: the blocking one in a thread), then the counter."""
        await _common.ajob(float(job.payload or b"0"))

    try:
        yield pgq
    finally:
        await conn.close()


def main() -> None:
    args = _common.parse_args(needs_pg=True)
    body = _common.chosen_body(("async", "sync"))  # asyncio: its own body is async
    _common.install_sigterm()
    loop = asyncio.new_event_loop()
    conn = loop.run_until_complete(asyncpg.connect(args.pg_url))
    queries = Queries(AsyncpgDriver(conn))
    loop.run_until_complete(queries.install())

    def enqueue_bulk(ts: list[float]) -> None:
        payloads = [repr(t).encode() for t in ts]
        loop.run_until_complete(queries.enqueue(["noop"] * len(ts), payloads, [0] * len(ts)))

    def start_workers(w: _common.Workers) -> None:
        exe = str(Path(sys.executable).parent / "pgq")
        for _ in range(2):
            w.start(
                [
                    exe,
                    "run",
                    "pgqueuer_driver:create_pgqueuer",
                    "--batch-size",
                    "10",
                    # without a cap a worker takes every queued job at once; 20 is the least
                    # pgqueuer allows with batches of 10 (2 x the batch)
                    "--max-concurrent-tasks",
                    "20",
                    "--log-level",
                    "WARNING",
                ]
            )

    try:
        result = _common.run_workload(
            args,
            system="pgqueuer",
            version=version("pgqueuer"),
            keeps_jobs_in="Postgres",
            enqueue_one=lambda t: loop.run_until_complete(
                queries.enqueue("noop", repr(t).encode())
            ),
            enqueue_bulk=enqueue_bulk,
            start_workers=start_workers,
            settings="asyncpg + uvloop, 2 x `pgq run --batch-size 10 --max-concurrent-tasks 20`, "
            f"LISTEN/NOTIFY, {_common.BODY_LABEL[body]}",
        )
    finally:
        loop.run_until_complete(conn.close())
        loop.close()
    _common.emit(result)


if __name__ == "__main__":
    main()
