"""pgqueuer driver: Postgres via asyncpg, 2 ``pgq run`` processes with ``--batch-size 10``
and no cap on jobs in flight (LISTEN/NOTIFY wake-ups; both its defaults), an ``async def``
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
                    # No --max-concurrent-tasks, as pgqueuer's users run it: jobs in flight
                    # are not capped. A cap (at least 2 x the batch) makes a worker that
                    # reaches it wait up to 100 ms for a NOTIFY before its next dequeue: one
                    # run at 20 drained 911 jobs/s where the uncapped one drains thousands.
                    "--batch-size",
                    "10",
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
            settings="asyncpg + uvloop, 2 x `pgq run --batch-size 10` (jobs in flight not capped: "
            f"its default), LISTEN/NOTIFY, {_common.BODY_LABEL[body]}",
        )
    finally:
        loop.run_until_complete(conn.close())
        loop.close()
    _common.emit(result)


if __name__ == "__main__":
    main()
