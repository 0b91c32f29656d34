"""A pool whose completer cannot write stops claiming (issue 21).

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
from hivejobs.pool import PREFETCH, REFILL_BELOW, UNWRITTEN_PER_RUNNER, Running
from tests.harness import wait_until
from tests.integration.test_lifecycle import FAST, ThreadPool

CONCURRENCY = 2
JOBS = 40


@pytest.fixture
def pool_thread() -> Iterator[Callable[[App, str], ThreadPool]]:
    started: list[tuple[ThreadPool, threading.Thread]] = []

    def start(app: App, name: str) -> ThreadPool:
        pool = ThreadPool(app, name)
        thread = threading.Thread(target=pool.run, name=f"pool-{name}", daemon=True)
        thread.start()
        started.append((pool, thread))
        return pool

    yield start
    for pool, _ in started:
        pool.stop_acquiring.set()
    for pool, thread in started:
        thread.join(15)
        assert not thread.is_alive(), "pool did not stop"
        for done in (pool.fetcher_done, pool.control_done):
            wait_until(done.is_set, timeout=5, what="fetcher and control threads stopped")
        for _ in range(pool.jt.concurrency):
            pool.work.put(None)
        pool.store.close()
        pool.broker.close()


def count(url: str, query: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(query).fetchone()
    assert row is not None
    return int(row[0])


def test_pool_stops_claiming_while_its_completions_cannot_be_written(
    make_app: Callable[..., App],
    database_url: str,
    pool_thread: Callable[[App, str], ThreadPool],
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
            with pool.lock:
                return len(ran) >= limit and pool.reserved == 0

        wait_until(stalled, timeout=10, what="the pool to hold its limit of unwritten claims")
        # Every claim it holds has finished running and waits for the completer; none is in
        # hand, and the fetcher has no room: it claims nothing more until a write happens.
        with pool.lock:
            assert len(pool.held) == limit
            assert pool.claim_room() <= 0
        assert len(ran) == limit
        assert not pool.completer.idle()
        running = "SELECT count(*) FROM hivejobs_job WHERE state = 'running'"
        assert count(database_url, running) == limit
        assert app.broker.queue_lengths(["note"])[0][("note", 0)] == JOBS - limit
        blocker.rollback()  # the completer writes; claiming resumes

    succeeded = "SELECT count(*) FROM hivejobs_archive WHERE state = 'succeeded'"
    wait_until(lambda: count(database_url, succeeded) == JOBS, timeout=20, what="all written")
    assert sorted(ran) == list(range(JOBS))
    assert pool.counts["paused_for_completions"] >= 1


def test_prefetch_refills_in_one_large_claim_not_one_per_finished_job(
    make_app: Callable[..., App],
) -> None:
    """Issue 13: a fetcher that claimed again as soon as one slot freed made claims of one or
    two ids with short jobs. While enough claimed jobs wait for a runner it claims nothing;
    below REFILL_BELOW it claims the whole prefetch room at once. Without prefetch (at-most-
    once, or slow jobs) every idle runner is still claimed for at once."""
    app = make_app(**FAST)

    @app.job("short", concurrency=8)
    def short(ctx: JobContext, payload: dict[str, int]) -> None: ...

    @app.job("once", concurrency=8, delivery="at_most_once")
    def once(ctx: JobContext, payload: dict[str, int]) -> None: ...

    prefetching, not_prefetching = ThreadPool(app, "short"), ThreadPool(app, "once")
    try:
        for pool in (prefetching, not_prefetching):
            pool.avg_run_s = 0.0001  # measured short
            pool.running = {str(i): Running.__new__(Running) for i in range(8)}  # all busy
        with prefetching.lock:
            prefetching.reserved = 8 + REFILL_BELOW + 1  # one more waiting than the mark
            assert prefetching.claim_room() == 0
            prefetching.reserved = 8 + REFILL_BELOW
            assert prefetching.claim_room() == PREFETCH - REFILL_BELOW
        with not_prefetching.lock:
            not_prefetching.reserved = 7  # one runner idle
            assert not_prefetching.claim_room() == 1
    finally:
        for pool in (prefetching, not_prefetching):
            pool.store.close()
            pool.broker.close()
