"""pgqueuer driver: Postgres via asyncpg, 2 ``pgq run`` processes with ``--batch-size 10``
and no cap on jobs in flight (LISTEN/NOTIFY wake-ups; both its defaults; see MAX_TASKS), an
``async def`` entrypoint. Bulk = ``Queries.enqueue`` with lists."""

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


# Jobs in flight per worker process (PEERS_PGQ_MAX_TASKS; 0: uncapped, pgqueuer's default).
# pgqueuer allows no cap under 2 x the batch, and a worker that reaches its cap waits up to
# 100 ms for a NOTIFY before it dequeues again (none comes while a backlog drains), so a cap C
# bounds a process near C / 0.1 s; uncapped, one process takes thousands of queued jobs at
# once. Uncapped is kept: in one screening (0.1 ms, 5,000 jobs, 2 runs each, load ~16) it
# drained 679 / 661 jobs/s against 559 / 487 capped at 200 and 582 / 467 at 1,000.
MAX_TASKS = os.environ.get("PEERS_PGQ_MAX_TASKS", "0")


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
        cap = ["--max-concurrent-tasks", MAX_TASKS] if MAX_TASKS != "0" else []
        for _ in range(2):
            w.start(
                [
                    exe,
                    "run",
                    "pgqueuer_driver:create_pgqueuer",
                    "--batch-size",
                    "10",
                    *cap,
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
            settings="asyncpg + uvloop, 2 x `pgq run --batch-size 10"
            + (f" --max-concurrent-tasks {MAX_TASKS}`" if MAX_TASKS != "0" else "` (uncapped)")
            + f", LISTEN/NOTIFY, {_common.BODY_LABEL[body]}",
        )
    finally:
        loop.run_until_complete(conn.close())
        loop.close()
    _common.emit(result)


if __name__ == "__main__":
    main()
