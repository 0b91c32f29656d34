"""A sequenced chain step on real Postgres, statement by statement: the place it takes in its
key's line when the chain starts its first try, kept by the chain's retries and given up when
the step ends for good (holding the key under on_failure="hold") or its chain is stopped.

Each test builds the state with the App's own calls, runs one traverser pass at a time, claims
with the store's sequenced claim as a pool does and writes completions as the completer does.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import psycopg
import pytest

from hivejobs import App, Chain, JobContext
from hivejobs.coordinator.traverser import Traverser
from hivejobs.errors import ChainInvalid
from hivejobs.records.jobs import ClaimedJob
from hivejobs.store import new_worker_id
from hivejobs.store.chains import ChainStore
from hivejobs.store.sequence import SEQ, SequenceStore
from tests.harness import sql, wait_until
from tests.integration.test_coordinator import leader
from tests.integration.test_sequence import claim, enqueue_line, finish, make, queued_at_set

LIVE = "SELECT count(*) FROM hivejobs_job WHERE id = %s"
PLACES = "SELECT step, key, seq FROM hivejobs_sequence_place ORDER BY seq"


def pass_over(app: App, request_ids: str) -> None:
    """One traverser pass over the chains named (comma-separated)."""
    Traverser(app.connections.store, app.connections.broker).run_once(
        leader(app), only=set(request_ids.split(","))
    )


def step_chain(app: App, tries: int = 1, retry_wait: float = 0.0) -> str:
    chain = Chain("posting")
    chain.job("step", {"account": "a", "i": "chain"}, key="post", tries=tries,
              retry_wait=retry_wait)  # fmt: skip
    return app.run_chain(chain)


def seq_of(database_url: str, job_id: str) -> tuple[str, int, bool]:
    ((key, seq, hold),) = sql(
        database_url, "SELECT seq_key, seq, seq_hold FROM hivejobs_job WHERE id = %s", (job_id,)
    )
    return key, seq, hold


def stalled(app: App) -> list[tuple[str, str]]:
    with app.connections.store.connection() as conn:
        return [tuple(r) for r in conn.execute(SEQ["stalled_keys"], {"limit": 10}).fetchall()]


def only(jobs: list[ClaimedJob]) -> ClaimedJob:
    (job,) = jobs
    return job


def test_a_retry_keeps_the_first_tries_place_in_its_key(
    make_app: Callable[..., App], database_url: str
) -> None:
    """Plain job, chain step, plain job of one key: the step's place is taken at its first
    try (between the two), its failed try keeps it (the later job stays parked, also while
    the retry is not yet created), and the retry runs in that turn; its success hands over."""
    app = make(make_app())
    (before,) = enqueue_line(app, "a", 1)
    request_id = step_chain(app, tries=2)
    pass_over(app, request_id)
    first_try = f"{request_id}:post:1"
    (after,) = enqueue_line(app, "a", 1)
    assert [r[2] for r in sql(database_url, PLACES)] == [2]
    assert seq_of(database_url, first_try) == ('"a"', 2, False)
    assert seq_of(database_url, after)[1] == 3

    running = only(claim(app, [after, first_try, before]))
    assert running.id == before
    finish(app, running, "succeeded")
    assert queued_at_set(database_url, first_try)
    tried = only(claim(app, [after, first_try]))
    assert tried.id == first_try
    finish(app, tried, "failed")
    assert not queued_at_set(database_url, after)  # no live try, but the place comes first
    assert [(k.key, k.queued, k.next_id) for k in app.keys("step")] == [('"a"', 1, first_try)]
    assert stalled(app) == []  # nor does the sequencer's repair see a key to hand over
    assert SequenceStore(app.connections.store).hand_over_stalled() == []
    assert claim(app, [after]) == []
    assert not queued_at_set(database_url, after)

    pass_over(app, request_id)
    second_try = f"{request_id}:post:2"
    assert seq_of(database_url, second_try) == ('"a"', 2, False)
    retried = only(claim(app, [after, second_try]))
    assert retried.id == second_try
    finish(app, retried, "succeeded")
    assert sql(database_url, PLACES) == []  # given up at the completion, before the traverser
    assert queued_at_set(database_url, after)
    pass_over(app, request_id)
    assert app.chain_status(request_id).state == "succeeded"
    assert only(claim(app, [after])).id == after


@pytest.mark.parametrize("on_failure", ["hold", "continue"])
def test_a_step_failed_for_good_holds_or_hands_on_its_key(
    make_app: Callable[..., App], database_url: str, on_failure: str
) -> None:
    app = make(make_app(), on_failure=on_failure)
    request_id = step_chain(app)
    pass_over(app, request_id)
    try_id = f"{request_id}:post:1"
    (after,) = enqueue_line(app, "a", 1)
    finish(app, only(claim(app, [try_id, after])), "failed")
    assert claim(app, [after]) == []
    pass_over(app, request_id)
    assert app.chain_status(request_id).state == "failed"
    assert sql(database_url, PLACES) == []
    (key,) = app.keys("step")
    if on_failure == "hold":
        assert (key.key, key.held_by, key.held_error, key.next_id) == ('"a"', try_id, "boom", after)
        assert claim(app, [after]) == []
        assert app.release_key("step", '"a"') == try_id
    else:
        assert key.held_by is None
    assert queued_at_set(database_url, after)
    assert only(claim(app, [after])).id == after


def test_the_replay_of_a_held_step_takes_its_place(
    make_app: Callable[..., App], database_url: str
) -> None:
    app = make(make_app())
    request_id = step_chain(app)
    pass_over(app, request_id)
    try_id = f"{request_id}:post:1"
    (after,) = enqueue_line(app, "a", 1)
    finish(app, only(claim(app, [try_id])), "failed")
    pass_over(app, request_id)
    replay = app.replay(try_id)
    assert only(claim(app, [after, replay])).id == replay


def test_stopping_the_chain_between_tries_gives_the_key_on_without_a_hold(
    make_app: Callable[..., App], database_url: str
) -> None:
    app = make(make_app())
    request_id = step_chain(app, tries=3, retry_wait=3600.0)
    pass_over(app, request_id)
    (after,) = enqueue_line(app, "a", 1)
    finish(app, only(claim(app, [f"{request_id}:post:1", after])), "failed")
    pass_over(app, request_id)  # the step waits an hour for its retry, in its place
    assert len(sql(database_url, PLACES)) == 1
    assert claim(app, [after]) == []
    only_place = [(k.key, k.queued, k.next_id) for k in app.keys("step")]
    assert only_place == [('"a"', 1, f"{request_id}:post:1")]
    assert app.stop_chain(request_id)
    pass_over(app, request_id)
    assert app.chain_status(request_id).state in ("failed", "stopped")
    assert sql(database_url, PLACES) == []
    assert [k.held_by for k in app.keys("step")] == [None]
    assert queued_at_set(database_url, after)
    assert only(claim(app, [after])).id == after


def test_the_prune_keeps_a_key_whose_step_is_between_tries(
    make_app: Callable[..., App], database_url: str
) -> None:
    """A key with no live job but a step's place is not idle: its counter stays, so no job
    can be numbered before the step's retry. A job enqueued then is refused for the place
    alone, and parked (out of Redis until the step ends)."""
    app = make(make_app())
    request_id = step_chain(app, tries=2, retry_wait=3600.0)
    pass_over(app, request_id)
    finish(app, only(claim(app, [f"{request_id}:post:1"])), "failed")
    pass_over(app, request_id)
    waiting = [(k.key, k.queued, k.running, k.next_id) for k in app.keys("step")]
    assert waiting == [('"a"', 0, 0, f"{request_id}:post:1")]  # a key with a place only
    sql(database_url, "UPDATE hivejobs_sequence SET used_at = now() - interval '1 day'")
    assert SequenceStore(app.connections.store).prune_idle(retention_s=60) == 0
    (after,) = enqueue_line(app, "a", 1)
    assert seq_of(database_url, after)[1] == 2
    assert claim(app, [after]) == []
    assert not queued_at_set(database_url, after)


def test_an_enqueuers_open_transaction_delays_the_step_not_the_other_chains(
    make_app: Callable[..., App], database_url: str
) -> None:
    """An enqueue of the key inside a caller's transaction holds the key's counter to its
    commit: the pass leaves that step for later (its place would otherwise come before a
    number not yet committed) and goes on with the other chains; after the commit the step
    takes the next place, behind the caller's job."""
    app = make(make_app())
    app.job("plain")(lambda ctx, payload: None)
    app.connections.store.upsert_job_types([app.types["plain"].info()])
    waiting = step_chain(app)
    other = Chain("other")
    other.job("plain", {}, key="p")
    other_id = app.run_chain(other)
    with psycopg.connect(database_url) as caller:
        held = app.enqueue("step", {"account": "a", "i": 0}, conn=caller)
        errors: list[BaseException] = []

        def one_pass() -> None:
            try:
                pass_over(app, f"{waiting},{other_id}")
            except BaseException as exc:  # the assertion below reports it
                errors.append(exc)

        passed = threading.Thread(target=one_pass)
        passed.start()
        wait_until(lambda: not passed.is_alive(), what="the pass, not waiting on the caller")
        assert errors == []
        assert sql(database_url, LIVE, (f"{other_id}:p:1",)) == [(1,)]
        assert sql(database_url, LIVE, (f"{waiting}:post:1",)) == [(0,)]
        caller.commit()
    pass_over(app, waiting)
    assert seq_of(database_url, held)[1] == 1
    assert seq_of(database_url, f"{waiting}:post:1")[1] == 2


def test_a_chain_sequence_retry_of_the_failed_step_keeps_its_place(
    make_app: Callable[..., App], database_url: str
) -> None:
    """The step fails for good inside a chain sequence with a retry left: the sequence starts
    again, the step's place stays (no hold, the later job stays parked), and the retry runs
    in the first try's turn."""
    app = make(make_app())
    chain = Chain("posting")
    post = chain.job("step", {"account": "a", "i": "chain"}, key="post")
    chain.sequence([post], retries=1)
    request_id = app.run_chain(chain)
    pass_over(app, request_id)
    (after,) = enqueue_line(app, "a", 1)
    finish(app, only(claim(app, [f"{request_id}:post:1", after])), "failed")
    pass_over(app, request_id)  # the sequence starts again: a new try, in the same place
    assert [k.held_by for k in app.keys("step")] == [None]
    retry = f"{request_id}:post:2"
    assert seq_of(database_url, retry)[1] == 1 and seq_of(database_url, after)[1] == 2
    assert only(claim(app, [after, retry])).id == retry


def test_a_sequenced_step_added_at_run_time_takes_its_place_too(
    make_app: Callable[..., App], database_url: str
) -> None:
    """ctx.chain.add of a sequenced step: its key is recorded as for a declared step (one
    without the field is refused, nothing stored), and its first try takes its place."""
    app = make(make_app())
    app.job("plain")(lambda ctx, payload: None)
    app.connections.store.upsert_job_types([app.types["plain"].info()])
    chain = Chain("grows")
    chain.job("plain", {}, key="root")
    request_id = app.run_chain(chain)
    pass_over(app, request_id)
    with app.connections.store.connection() as conn:
        (claimed,) = app.connections.store.claim_queued(
            [f"{request_id}:root:1"], new_worker_id(), conn, name="plain"
        )
    ctx = JobContext(claimed, app, ChainStore(app.connections.store))
    assert ctx.chain is not None
    bad = ctx.chain.grow()
    bad.job("step", {"acount": "a"}, name="post")
    with pytest.raises(ChainInvalid, match="no 'account' field"):
        ctx.chain.add(bad)
    more = ctx.chain.grow()
    more.job("step", {"account": "a", "i": "added"}, name="post")
    assert ctx.chain.add(more) == ["root.post"]
    (before,) = enqueue_line(app, "a", 1)
    finish(app, claimed, "succeeded")
    pass_over(app, request_id)
    assert sql(database_url, PLACES) == [("root.post", '"a"', 2)]
    assert seq_of(database_url, f"{request_id}:root.post:1") == ('"a"', 2, False)
    assert seq_of(database_url, before)[1] == 1
