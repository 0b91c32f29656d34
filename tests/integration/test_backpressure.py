"""A pool whose completer cannot write stops claiming.

A real Pool runs in a thread of the test process. The completer is held up by a lock on the
archive that the test takes (its INSERT waits; claims do not touch the archive), so finished
attempts pile up unwritten exactly as behind a slow completion statement.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import psycopg
import pytest

from hivejobs import App, JobContext
from hivejobs.store import new_worker_id
from hivejobs.worker.fetcher import CLAIM_AHEAD_S, PREFETCH, UNWRITTEN_PER_RUNNER
from hivejobs.worker.process import Pool
from hivejobs.worker.slots import Running
from tests.harness import wait_until
from tests.integration.test_lifecycle import FAST, start_pool_thread, stop_pool_thread

CONCURRENCY = 2
JOBS = 40


@pytest.fixture
def pool_thread() -> Iterator[Callable[[App, str], Pool]]:
    started: list[tuple[Pool, threading.Thread]] = []

    def start(app: App, name: str) -> Pool:
        pool, thread = start_pool_thread(app, name)
        started.append((pool, thread))
        return pool

    yield start
    for pool, _ in started:
        pool.stop.signal()
    for pool, thread in started:
        stop_pool_thread(pool, thread)


def count(url: str, query: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(query).fetchone()
    assert row is not None
    return int(row[0])


def test_pool_stops_claiming_while_its_completions_cannot_be_written(
    make_app: Callable[..., App],
    database_url: str,
    pool_thread: Callable[[App, str], Pool],
) -> None:
    app = make_app(**FAST)
    ran: list[int] = []

    # At-most-once: no prefetch, so the bound is exactly UNWRITTEN_PER_RUNNER x concurrency.
    @app.job("note", concurrency=CONCURRENCY, delivery="at_most_once")
    def note(ctx: JobContext, payload: dict[str, int]) -> None:
        ran.append(payload["n"])

    app.enqueue_many("note", [{"n": i} for i in range(JOBS)])
    limit = UNWRITTEN_PER_RUNNER * CONCURRENCY

    with psycopg.connect(database_url) as blocker:
        blocker.execute("LOCK TABLE hivejobs_archive IN SHARE MODE")  # completions wait
        pool = pool_thread(app, "note")

        def stalled() -> bool:
            # Every claim ran (`ran`), handed its completion over and freed its slot.
            with pool.slots.cond:
                return len(ran) >= limit and pool.slots.reserved == 0

        wait_until(stalled, timeout=10, what="the pool to hold its limit of unwritten claims")
        # Every claim it holds has finished running and waits for the completer; none is in
        # hand, and the fetcher has no room: it claims nothing more until a write happens.
        with pool.slots.cond:
            assert len(pool.fetcher.claims.held) == limit
            assert pool.fetcher.claim_room() <= 0
        assert len(ran) == limit
        assert not pool.completer.idle()
        running = "SELECT count(*) FROM hivejobs_job WHERE state = 'running'"
        assert count(database_url, running) == limit
        assert app.connections.broker.queue_lengths(["note"])[0][("note", 0)] == JOBS - limit
        blocker.rollback()  # the completer writes; claiming resumes

    succeeded = "SELECT count(*) FROM hivejobs_archive WHERE state = 'succeeded'"
    wait_until(lambda: count(database_url, succeeded) == JOBS, timeout=20, what="all written")
    assert sorted(ran) == list(range(JOBS))
    assert pool.fetcher.counts["paused_for_completions"] >= 1


def test_prefetch_refills_in_one_large_claim_not_one_per_finished_job(
    make_app: Callable[..., App],
) -> None:
    """A fetcher that claimed again as soon as one slot freed would make claims of one or
    two ids. While half its claims ahead (PREFETCH for short jobs, CLAIM_AHEAD_S of work for
    longer ones) still wait for a runner it claims nothing; then it claims the whole room at
    once. Without claims ahead (at-most-once, or jobs too slow for any) every idle runner is
    still claimed for at once."""
    app = make_app(**FAST)

    @app.job("short", concurrency=8)
    def short(ctx: JobContext, payload: dict[str, int]) -> None: ...

    @app.job("once", concurrency=8, delivery="at_most_once")
    def once(ctx: JobContext, payload: dict[str, int]) -> None: ...

    prefetching, not_prefetching = (
        Pool(app, app.types[name], new_worker_id(), app.settings) for name in ("short", "once")
    )
    try:
        for pool in (prefetching, not_prefetching):
            pool.fetcher.avg_run_s = 0.0001  # measured short
            busy = {str(i): Running.__new__(Running) for i in range(8)}
            pool.slots.running = busy  # every runner busy
        half = PREFETCH // 2
        with prefetching.slots.cond:
            prefetching.slots.reserved = 8 + half + 1  # one more waiting than the mark
            assert prefetching.fetcher.claim_room() == 0
            prefetching.slots.reserved = 8 + half
            assert prefetching.fetcher.claim_room() == PREFETCH - half
        with not_prefetching.slots.cond:
            not_prefetching.slots.reserved = 7  # one runner idle
            assert not_prefetching.fetcher.claim_room() == 1
        # 20 ms jobs: 8 runners x 80 ms / 20 ms = 32 ahead, refilled when 16 wait: claims of
        # 16, not one per finished job (1.5 ids per claim at 10 ms before claims ahead).
        assert CLAIM_AHEAD_S == 0.08
        prefetching.fetcher.avg_run_s = 0.020
        with prefetching.slots.cond:
            prefetching.slots.reserved = 8 + 17
            assert prefetching.fetcher.claim_room() == 0
            prefetching.slots.reserved = 8 + 16
            assert prefetching.fetcher.claim_room() == 16
        # Slow jobs (8 runners x 80 ms < one job's time): a claim per idle runner, none ahead.
        prefetching.fetcher.avg_run_s = 0.7
        with prefetching.slots.cond:
            prefetching.slots.reserved = 7
            assert prefetching.fetcher.claim_room() == 1
    finally:
        for pool in (prefetching, not_prefetching):
            pool.close()
