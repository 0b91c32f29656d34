"""`limit_by` with `rate` on real Postgres and Redis: a token bucket per partition,
taken in the claim under the type's flow lock, and pruned by the coordinator once full."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable

from hivejobs import App
from hivejobs.flow import SLOT_POLL_S, Flow, Limits
from hivejobs.records.jobs import ClaimedJob, Completion
from hivejobs.store import new_worker_id
from hivejobs.store.archive import prune_archive
from tests.harness import sql, wait_until

# A bucket of 5 that refills once an hour: over a test, each customer may start 5 jobs and
# not one more, whatever the timing, so the bound is exact.
SLOW = Limits(global_concurrency=2, rate_per_s=1 / 3600, burst=5, limit_by="customer")
FAST = Limits(rate_per_s=50.0, burst=1, limit_by="customer")
BUCKETS = "SELECT part, tokens FROM hivejobs_flow_bucket WHERE name = %s ORDER BY part"


def make(app: App) -> App:
    app.job("slow_by", global_concurrency=2, rate="1/h", burst=5, limit_by="customer")(
        lambda ctx, payload: None
    )
    app.job("fast_by", rate="50/s", burst=1, limit_by="customer")(lambda ctx, payload: None)
    app.connections.store.upsert_job_types([jt.info() for jt in app.types.values()])
    return app


def claim(app: App, flow: Flow, ids: list[str]) -> list[ClaimedJob]:
    with app.connections.store.connection() as conn:
        return flow.claim(conn, ids, new_worker_id())


def finish(app: App, jobs: list[ClaimedJob]) -> None:
    done = [Completion(id=j.id, claim_token=j.claim_token, outcome="succeeded") for j in jobs]
    if done:
        with app.connections.store.connection() as conn:
            app.connections.store.finish(done, conn)


def test_racing_claims_never_exceed_any_partitions_budget(
    make_app: Callable[..., App], database_url: str
) -> None:
    """16 threads claim random batches of 4 customers' jobs and finish them while claiming
    again (holders overlap): each customer starts exactly its burst of 5, never more, never
    more than 2 at once; a customer out of tokens does not stop the others reaching theirs."""
    app = make(make_app())
    customers = ["acme", "globex", "initech", "umbrella"]
    owner: dict[str, str] = {}
    for c in customers:
        for job_id in app.enqueue_many("slow_by", [{"customer": c}] * 12):
            owner[job_id] = c
    lock = threading.Lock()
    holding = dict.fromkeys(customers, 0)
    peak = dict.fromkeys(customers, 0)
    started = dict.fromkeys(customers, 0)
    left = list(owner)

    def release(jobs: list[ClaimedJob]) -> None:
        with lock:  # counted out before the completion commits: still inside the slot
            for j in jobs:
                holding[owner[j.id]] -= 1
        finish(app, jobs)

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        flow = Flow(app.connections.store, app.connections.broker, "slow_by", SLOW)
        flow.room(1)  # makes the flow row, as a pool's first look does
        kept: list[ClaimedJob] = []
        for _ in range(40):
            with lock:
                batch = rng.sample(left, min(4, len(left)))
            jobs = claim(app, flow, batch)
            with lock:
                for j in jobs:
                    c = owner[j.id]
                    holding[c] += 1
                    started[c] += 1
                    peak[c] = max(peak[c], holding[c])
                    left.remove(j.id)
            release(kept)
            kept = jobs
        release(kept)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert started == dict.fromkeys(customers, 5)
    assert peak == dict.fromkeys(customers, 2)
    # The rows agree: 5 started jobs per customer (finished, archived), the rest never started.
    per_customer = """SELECT convert_from(payload, 'UTF8')::jsonb ->> 'customer', count(*)
                        FROM hivejobs_archive WHERE started_at IS NOT NULL GROUP BY 1"""
    assert dict(sql(database_url, per_customer)) == dict.fromkeys(customers, 5)
    unstarted = "SELECT count(*) FROM hivejobs_job WHERE state = 'queued' AND started_at IS NULL"
    assert sql(database_url, unstarted)[0][0] == 4 * 7
    # Every bucket is empty now: the rest of the jobs wait, queued (none lost).
    flow = Flow(app.connections.store, app.connections.broker, "slow_by", SLOW)
    assert claim(app, flow, list(left)) == []
    assert len(left) == 4 * 7
    rows = sql(database_url, BUCKETS, ("slow_by",))
    assert [p for p, _ in rows] == sorted(f'"{c}"' for c in customers)
    assert all(0 <= tokens < 0.1 for _, tokens in rows)  # an hour refills one token


def test_a_dry_partition_goes_to_the_tail_and_the_pool_waits_for_its_next_token(
    make_app: Callable[..., App],
) -> None:
    app = make(make_app())
    flow = Flow(app.connections.store, app.connections.broker, "fast_by", FAST)
    flow.room(1)
    a = app.enqueue_many("fast_by", [{"customer": "a"}] * 3)
    b = app.enqueue("fast_by", {"customer": "b"})
    app.flush()
    popped = app.connections.broker.pop("fast_by", 10)
    jobs = claim(app, flow, popped.ids)
    assert [j.id for j in jobs] == [a[0], b]  # one token each (burst 1): a's others wait
    assert flow.put_back(popped, jobs) == 0.0
    popped = app.connections.broker.pop("fast_by", 10)
    assert popped.ids == a[1:]  # at the tail, in order, kept
    jobs = claim(app, flow, popped.ids)
    if not jobs:  # a's next token, 20 ms away at 50/s, had not come: wait for it, not a poll
        assert 0 < flow.put_back(popped, jobs) <= 0.02 < SLOT_POLL_S
        popped = app.connections.broker.pop("fast_by", 10)
        assert popped.ids == a[1:]
        jobs = wait_until(lambda: claim(app, flow, popped.ids), what="a's next token")
    assert [j.id for j in jobs] == [a[1]]  # one token, one start


def test_the_coordinator_prunes_full_buckets_only(
    make_app: Callable[..., App], database_url: str
) -> None:
    """A bucket refilled to full means what no row means: the pruner deletes it, and the
    partition starts again from a full bucket. A bucket still refilling stays."""
    app = make(make_app())
    fast = Flow(app.connections.store, app.connections.broker, "fast_by", FAST)
    slow = Flow(app.connections.store, app.connections.broker, "slow_by", SLOW)
    fast.room(1)
    slow.room(1)
    ids = app.enqueue_many("fast_by", [{"customer": f"c{n}"} for n in range(50)])
    assert len(claim(app, fast, ids)) == 50  # 50 partitions, each with a bucket of 1
    held = app.enqueue("slow_by", {"customer": "s"})
    assert [j.id for j in claim(app, slow, [held])] == [held]
    assert len(sql(database_url, BUCKETS, ("fast_by",))) == 50
    full = "SELECT count(*) FROM hivejobs_flow_bucket WHERE name = 'fast_by' AND full_at > now()"
    wait_until(lambda: sql(database_url, full)[0][0] == 0, what="fast buckets full again")
    prune_archive(app.connections.store, app.settings.archive_retention_s)
    assert sql(database_url, BUCKETS, ("fast_by",)) == []
    assert [p for p, _ in sql(database_url, BUCKETS, ("slow_by",))] == ['"s"']
    again = app.enqueue("fast_by", {"customer": "c0"})
    assert [j.id for j in claim(app, fast, [again])] == [again]  # no row: a full bucket
