"""Debounce and coalesce (hivejobs/debounce.py) against real Postgres and Redis: racing
enqueuers of one key make one waiting job, the last payload wins or every payload is merged
once, the run waits for quiet within max_wait, a started job opens a new window, and bad
input stores nothing. Times are the database clock's; nothing sleeps."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
import redis

from hivejobs import App, InvalidArgument, InvalidJobType, JobContext, PayloadInvalid, Unique
from hivejobs.store.archive import prune_archive
from hivejobs.store.notify import parse_dispatch
from tests.harness import REDIS_URL, sql

WITHIN = 600.0  # no job comes due during a test unless the test moves its clock


def live(database_url: str) -> list[tuple[Any, ...]]:
    """The live jobs: (id, state, payload decoded, priority, run_at)."""
    query = "SELECT id, state, payload, priority, run_at FROM hivejobs_job ORDER BY created_at"
    return [(r[0], r[1], json.loads(r[2]), r[3], r[4]) for r in sql(database_url, query)]


def db_now(database_url: str) -> datetime:
    now: datetime = sql(database_url, "SELECT clock_timestamp()")[0][0]
    return now


def race(n: int, enqueue: Callable[[int], str]) -> list[str]:
    """`enqueue(i)` from n threads released at once; the ids they returned."""
    barrier = threading.Barrier(n)
    ids: list[str] = []
    errors: list[BaseException] = []

    def run(i: int) -> None:
        barrier.wait()
        try:
            ids.append(enqueue(i))
        except BaseException as exc:  # reported below: a thread's error must fail the test
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert len(ids) == n
    return ids


def debounced(make_app: Callable[..., App], max_wait: float | None = None) -> App:
    app = make_app()

    @app.job("sync", unique=Unique(key=["user"], within=WITHIN, mode="debounce", max_wait=max_wait))
    def sync(ctx: JobContext, payload: dict[str, Any]) -> None: ...

    return app


class Merges:
    """A coalesce merge that appends the item lists and records every call."""

    def __init__(self) -> None:
        self.seen: list[list[int]] = []
        self.lock = threading.Lock()

    def __call__(self, stored: object, new: object) -> object:
        assert isinstance(stored, dict) and isinstance(new, dict)
        with self.lock:
            self.seen.append(list(new["items"]))
        return {"user": stored["user"], "items": stored["items"] + new["items"]}


def coalesced(make_app: Callable[..., App], merge: Callable[[object, object], object]) -> App:
    app = make_app()

    @app.job("digest", unique=Unique(key=["user"], within=WITHIN, mode="coalesce", merge=merge))
    def digest(ctx: JobContext, payload: dict[str, Any]) -> None: ...

    return app


def test_sixteen_racing_threads_make_one_job_with_the_last_payload(
    make_app: Callable[..., App], database_url: str
) -> None:
    app = debounced(make_app)
    sql(database_url, "CREATE TABLE lock_order (n int, seq serial)")

    def enqueue(i: int) -> str:
        # In the caller's transaction the key stays locked until commit, so the order in
        # which the enqueues took the key is the order of these rows.
        with psycopg.connect(database_url) as conn:
            job_id = app.enqueue("sync", {"user": 7, "n": i}, conn=conn)
            conn.execute("INSERT INTO lock_order (n) VALUES (%s)", (i,))
        return job_id

    before = db_now(database_url)
    ids = race(16, enqueue)
    assert len(set(ids)) == 1
    rows = live(database_url)
    assert len(rows) == 1
    last = sql(database_url, "SELECT n FROM lock_order ORDER BY seq DESC LIMIT 1")[0][0]
    job_id, state, payload, _, run_at = rows[0]
    assert (job_id, state) == (ids[0], "scheduled")
    assert payload == {"user": 7, "n": last}
    # Each enqueue pushed the run to its own now + within: the last one's is the latest.
    assert run_at >= before + timedelta(seconds=WITHIN)
    # Plain enqueues (the store's own transactions) race into the same job.
    again = race(16, lambda i: app.enqueue("sync", {"user": 7, "n": 100 + i}))
    assert set(again) == {ids[0]}
    assert len(live(database_url)) == 1
    assert sql(database_url, "SELECT count(*) FROM hivejobs_debounce")[0][0] == 1
    # The job started: racing enqueuers open exactly one new window (the key lock decides;
    # the job row's own lock alone would let each of them start one).
    sql(database_url, "UPDATE hivejobs_job SET state = 'running', started_at = now()")
    after = race(16, lambda i: app.enqueue("sync", {"user": 7, "n": 200 + i}))
    assert len(set(after)) == 1 and after[0] != ids[0]
    assert sorted(row[1] for row in live(database_url)) == ["running", "scheduled"]
    assert app.enqueue("sync", {"user": 8}) != ids[0]  # another key, another job


def test_the_run_waits_for_quiet_within_max_wait(
    make_app: Callable[..., App], database_url: str, redis_prefix: str
) -> None:
    app = debounced(make_app, max_wait=WITHIN * 3)
    job_id = app.enqueue("sync", {"user": 1, "n": 0})
    first_run = live(database_url)[0][4]
    # A window's time passes (the key's first enqueue and the run move back on the db clock).
    shift = "UPDATE hivejobs_debounce SET first_at = first_at - %s * interval '1 second'"
    sql(database_url, shift, (WITHIN,))
    sql(database_url, "UPDATE hivejobs_job SET run_at = run_at - %s * interval '1 s'", (WITHIN,))
    before = db_now(database_url)
    assert app.enqueue("sync", {"user": 1, "n": 1}) == job_id
    state, run_at = live(database_url)[0][1], live(database_url)[0][4]
    assert state == "scheduled"
    assert run_at >= before + timedelta(seconds=WITHIN)  # pushed back: quiet again from now
    assert run_at > first_run - timedelta(seconds=WITHIN)
    # max_wait from the first enqueue has passed: the next enqueue makes it due at once,
    # with its own payload, and dispatches it.
    sql(database_url, shift, (WITHIN * 2,))  # now 3 * WITHIN since the first enqueue
    assert app.enqueue("sync", {"user": 1, "n": 2}) == job_id
    (_, state, payload, _, run_at) = live(database_url)[0]
    assert (state, payload) == ("queued", {"user": 1, "n": 2})
    assert run_at <= db_now(database_url)
    assert app.flush(10)
    client = redis.Redis.from_url(REDIS_URL)
    lists = [k for k in client.scan_iter(match=redis_prefix.replace("{", "\\{") + "*sync*")]
    assert any(
        job_id.encode() in client.lrange(k, 0, -1) for k in lists if client.type(k) == b"list"
    )
    client.close()


def test_a_started_or_cancelled_job_opens_a_new_window(
    make_app: Callable[..., App], database_url: str
) -> None:
    app = debounced(make_app)
    first = app.enqueue("sync", {"user": 1, "n": 0})
    # The job started (a pool claimed it): its payload is no longer changed.
    sql(
        database_url,
        "UPDATE hivejobs_job SET state = 'running', attempt = 1, started_at = now() WHERE id = %s",
        (first,),
    )
    second = app.enqueue("sync", {"user": 1, "n": 1})
    assert second != first
    payloads = {row[0]: row[2] for row in live(database_url)}
    assert payloads == {first: {"user": 1, "n": 0}, second: {"user": 1, "n": 1}}
    assert app.enqueue("sync", {"user": 1, "n": 2}) == second
    # A started job waiting for its retry (scheduled again) is not joined either.
    sql(
        database_url,
        "UPDATE hivejobs_job SET state = 'running', attempt = 1, started_at = now() WHERE id = %s",
        (second,),
    )
    retrying = "UPDATE hivejobs_job SET state = 'scheduled', started_at = now() WHERE id = %s"
    sql(database_url, retrying, (second,))
    second_retry = app.enqueue("sync", {"user": 1, "n": 3})
    assert second_retry != second
    assert {row[0]: row[2]["n"] for row in live(database_url)}[second] == 2
    second = second_retry
    app.cancel(second)
    third = app.enqueue("sync", {"user": 1, "n": 4})
    assert third not in (first, second)
    # The pruner drops a key whose job started, never one whose job still waits.
    sql(database_url, "DELETE FROM hivejobs_job WHERE id = %s", (third,))
    other = app.enqueue("sync", {"user": 2})
    prune_archive(app.connections.store, 7 * 86400.0)
    assert [r[0] for r in sql(database_url, "SELECT job_id FROM hivejobs_debounce")] == [other]


def test_debounce_in_the_callers_transaction(
    make_app: Callable[..., App], database_url: str
) -> None:
    app = debounced(make_app)
    job_id = app.enqueue("sync", {"user": 1, "n": 0})
    with psycopg.connect(database_url) as conn:
        assert app.enqueue("sync", {"user": 1, "n": 1}, conn=conn) == job_id
        conn.rollback()  # the job keeps the payload it had
        assert live(database_url)[0][2] == {"user": 1, "n": 0}
        assert app.enqueue("sync", {"user": 1, "n": 2}, conn=conn) == job_id
        conn.commit()
    assert live(database_url)[0][2] == {"user": 1, "n": 2}
    # A transaction that began before another enqueue, and enqueues after it: the run keeps
    # the other's later quiet time (now() is the transaction's start).
    with psycopg.connect(database_url) as conn:
        conn.execute("SELECT now()")  # the transaction starts here
        app.enqueue("sync", {"user": 1, "n": 3})
        quiet_from_3 = live(database_url)[0][4]
        app.enqueue("sync", {"user": 1, "n": 4}, conn=conn)
        conn.commit()
    assert live(database_url)[0][2::2] == ({"user": 1, "n": 4}, quiet_from_3)


def test_debounce_takes_the_last_priority_and_expiry(
    make_app: Callable[..., App], database_url: str
) -> None:
    app = debounced(make_app)
    later = datetime.now(UTC) + timedelta(hours=2)
    app.enqueue("sync", {"user": 1}, priority=5, expires_at=later)
    app.enqueue("sync", {"user": 1}, priority=2)
    assert live(database_url)[0][3] == 2
    assert sql(database_url, "SELECT expires_at FROM hivejobs_job") == [(None,)]


def test_a_due_job_made_in_a_transaction_is_dispatched_on_commit(
    make_app: Callable[..., App], database_url: str
) -> None:
    app = debounced(make_app, max_wait=WITHIN)
    job_id = app.enqueue("sync", {"user": 1, "n": 0})
    shift = "UPDATE hivejobs_debounce SET first_at = first_at - %s * interval '1 second'"
    sql(database_url, shift, (WITHIN,))  # max_wait has passed
    with psycopg.connect(database_url, autocommit=True) as listener:
        listener.execute("LISTEN hivejobs_dispatch")
        with psycopg.connect(database_url) as conn:
            assert app.enqueue("sync", {"user": 1, "n": 1}, conn=conn) == job_id
            conn.commit()
        heard = [n.payload for n in listener.notifies(timeout=10, stop_after=1)]
    assert [p.id for p in parse_dispatch(heard[0])] == [job_id]
    assert live(database_url)[0][1] == "queued"


def test_coalesce_merges_every_racing_enqueue_once(
    make_app: Callable[..., App], database_url: str
) -> None:
    merges = Merges()
    app = coalesced(make_app, merges)
    soon, later = (datetime.now(UTC) + timedelta(hours=h) for h in (1, 2))

    def enqueue(i: int) -> str:
        expiry = later if i == 5 else soon
        return app.enqueue(
            "digest", {"user": 1, "items": [i]}, priority=9 - i % 3, expires_at=expiry
        )

    ids = race(16, enqueue)
    assert len(set(ids)) == 1
    ((job_id, state, payload, priority, _),) = live(database_url)
    assert (job_id, state) == (ids[0], "scheduled")
    assert sorted(payload["items"]) == list(range(16))  # every enqueue's item, once
    # The merge saw each enqueue but the window's first once, as `new`.
    assert len(merges.seen) == 15
    assert sorted(x for new in merges.seen for x in new) == sorted(
        set(range(16)) - {payload["items"][0]}
    )
    assert priority == 7  # the most urgent of the merged enqueues
    assert sql(database_url, "SELECT expires_at FROM hivejobs_job") == [(later,)]  # the latest


def test_coalesce_in_the_callers_transaction_and_async(
    make_app: Callable[..., App], database_url: str
) -> None:
    import asyncio

    app = coalesced(make_app, Merges())
    job_id = app.enqueue("digest", {"user": 1, "items": [0]})
    with psycopg.connect(database_url) as conn:
        assert app.enqueue("digest", {"user": 1, "items": [1]}, conn=conn) == job_id
        conn.rollback()
    assert asyncio.run(app.aenqueue("digest", {"user": 1, "items": [2]})) == job_id
    assert live(database_url)[0][2] == {"user": 1, "items": [0, 2]}
    # Started: a later enqueue is not merged into it but opens a new window.
    sql(database_url, "UPDATE hivejobs_job SET state = 'running', started_at = now()")
    fresh = app.enqueue("digest", {"user": 1, "items": [3]})
    assert fresh != job_id
    assert [row[2]["items"] for row in live(database_url)] == [[0, 2], [3]]


def test_bad_declarations_are_refused_naming_the_field(make_app: Callable[..., App]) -> None:
    app = make_app()
    merge = Merges()
    for unique, field in (
        (Unique(within=60, mode="throttle"), "mode"),  # type: ignore[arg-type]
        (Unique(within=0, mode="debounce"), "within"),
        (Unique(within=float("nan"), mode="debounce"), "within"),
        (Unique(within=60, mode="debounce", max_wait=30), "max_wait"),
        (Unique(within=60, mode="coalesce"), "merge"),
        (Unique(within=60, mode="coalesce", merge=merge, max_wait=120), "max_wait"),
        (Unique(within=60, mode="debounce", merge=merge), "merge"),
        (Unique(within=60, mode="window", max_wait=120), "max_wait"),
        (Unique(key="user", within=60, mode="debounce"), "key"),
    ):
        with pytest.raises(InvalidJobType, match=f"unique {field}"):
            app.job("x", unique=unique)
    with pytest.raises(InvalidJobType, match="unique: give either"):
        app.job("x", unique_for=60, unique=Unique(within=60, mode="debounce"))
    assert "x" not in app.types


def test_bad_enqueues_store_nothing(make_app: Callable[..., App], database_url: str) -> None:
    def merge(stored: object, new: object) -> object:
        assert isinstance(new, dict)
        if new.get("boom"):
            raise ValueError("cannot merge")
        return ["not", "a", "dict"] if new.get("bad") else new

    app = coalesced(make_app, merge)
    job_id = app.enqueue("digest", {"user": 1, "items": [0]})
    for options, field in (({"id": "mine"}, "id"), ({"delay": 5}, "delay")):
        with pytest.raises(InvalidArgument, match=f"^{field}: "):
            app.enqueue("digest", {"user": 1, "items": [1]}, **options)
    with pytest.raises(InvalidArgument, match="merge of job type 'digest' raised"):
        app.enqueue("digest", {"user": 1, "items": [2], "boom": True})
    with pytest.raises(PayloadInvalid):  # the merge's result is checked as a payload is
        app.enqueue("digest", {"user": 1, "items": [2], "bad": True})
    with pytest.raises(InvalidArgument, match="one by one"):
        app.enqueue_many("digest", [{"user": 1, "items": [3]}])
    with pytest.raises(PayloadInvalid):
        app.enqueue("digest", [1, 2])  # no "user" field to key on
    with psycopg.connect(database_url) as conn:  # in a transaction: it stays usable
        with pytest.raises(InvalidArgument, match="merge"):
            app.enqueue("digest", {"user": 1, "items": [4], "boom": True}, conn=conn)
        assert conn.execute("SELECT 1").fetchone() == (1,)
        conn.commit()
    assert live(database_url) == [live(database_url)[0]]
    assert live(database_url)[0][:3] == (job_id, "scheduled", {"user": 1, "items": [0]})
    assert sql(database_url, "SELECT count(*) FROM hivejobs_debounce")[0][0] == 1
