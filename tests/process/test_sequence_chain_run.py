"""Sequenced chain steps with real `hivejobs run` instances: a step's place in its key's line
among plain jobs of the key, kept across the chain's retry of it, through kill -9 of the pool
and a rolling restart; on_failure="hold" and "continue" inside a chain; a stopped chain gives
its key on.

Order and one-at-a-time are judged from both the archive and the handlers' own ledger
(bench/sequence_check.py), as for plain sequenced jobs.
"""

from __future__ import annotations

import random
import signal
from collections.abc import Callable
from pathlib import Path

from bench.sequence_check import check

from hivejobs import App, Chain
from tests.harness import Instance, fleet_app, live_jobs, sql, wait_until
from tests.process.test_sequence_run import kills_and_a_rolling_restart

APP = "tests.apps.sequenceapp:app"
TRIED = "SELECT total_tries >= 1 FROM hivejobs_chain_job WHERE chain_id = %s"
STEP = "SELECT state, job_id, not_before IS NOT NULL FROM hivejobs_chain_job WHERE chain_id = %s"


def step_chain(
    app: App, name: str, payload: dict[str, object], tries: int = 1, retry_wait: float = 0.0
) -> str:
    chain = Chain("posting")
    chain.job(name, payload, key="post", tries=tries, retry_wait=retry_wait)
    return app.run_chain(chain)


def first_try_placed(url: str, request_id: str) -> None:
    """The chain has started its step's first try (in the transaction that took the step's
    place in its key's line); the try itself may have run and ended already."""
    wait_until(lambda: sql(url, TRIED, (request_id,)) == [(True,)], what="the step's first try")


def last_try(url: str, request_id: str) -> str:
    ((_, job_id, _),) = sql(url, STEP, (request_id,))
    return str(job_id)


def enqueue_with_steps(
    app: App, url: str, keys: int, per_key: int, seed: int
) -> tuple[dict[str, list[str]], dict[str, list[tuple[int, str]]]]:
    """Per key, `per_key` jobs in rounds: mostly plain enqueues, every fifth a chain whose
    step fails its first try and is retried by the chain. A chain's place is waited for
    before the key's next enqueue, so each key's line order is known: the returned lines
    hold plain ids, and (index, request id) for the steps, filled in once their last try is
    known."""
    rng = random.Random(seed)
    lines: dict[str, list[str]] = {f"k{k}": [] for k in range(keys)}
    steps: dict[str, list[tuple[int, str]]] = {a: [] for a in lines}
    for i in range(per_key):
        for account, ids in lines.items():
            payload = {"account": account, "i": i, "ms": rng.randint(5, 30)}
            if i % 5 == 2:
                request_id = step_chain(
                    app, "ordered", {**payload, "fail_first": True}, tries=4, retry_wait=0.3
                )
                first_try_placed(url, request_id)
                steps[account].append((i, request_id))
                ids.append("")
            else:
                ids.append(app.enqueue("ordered", payload))
    return lines, steps


def test_chain_steps_keep_their_place_through_retries_kills_and_a_rolling_restart(
    start_instance: Callable[..., Instance],
    make_app: Callable[..., App],
    database_url: str,
    ledger_dir: Path,
) -> None:
    """3 keys x 25 jobs, 5 of each a chain step that fails its first try: two kill -9 of the
    pool and a rolling restart; every job and chain succeeds, and per key the runs never
    overlap and start in line order, the failed try and its retry side by side."""
    first = start_instance(app_spec=APP)
    app = fleet_app(make_app, database_url, ["ordered"])
    lines, steps = enqueue_with_steps(app, database_url, keys=3, per_key=25, seed=34)
    second, dead = kills_and_a_rolling_restart(first, start_instance, database_url)
    chains = [r for account in steps.values() for _, r in account]
    wait_until(
        lambda: (
            live_jobs(database_url) == 0
            and all(app.chain_status(r).state == "succeeded" for r in chains)
        ),
        timeout=120,
        what="every job and chain done",
    )
    for account, placed in steps.items():
        for index, request_id in placed:
            lines[account][index] = last_try(database_url, request_id)
    report = check(database_url, ledger_dir, lines, dead)
    assert report.ok, report
    assert report.runs >= 75 + 15  # each step ran at least twice: its failed try, its retry
    assert sql(database_url, "SELECT count(*) FROM hivejobs_sequence_place") == [(0,)]
    second.signal_group(signal.SIGTERM)


def test_hold_continue_and_stop_inside_chains(
    start_instance: Callable[..., Instance],
    make_app: Callable[..., App],
    database_url: str,
    ledger_dir: Path,
) -> None:
    """`held`: a step failed for good holds its key (the later job waits) until released.
    `continued`: it lets the key go on. A chain stopped while its step waits for its retry
    gives the key on, with no hold."""
    start_instance(app_spec=APP)
    app = fleet_app(make_app, database_url, ["ordered", "held", "continued"])
    held = step_chain(app, "held", {"account": "a", "i": 0, "fail": True})
    first_try_placed(database_url, held)
    behind_hold = app.enqueue("held", {"account": "a", "i": 1})
    cont = step_chain(app, "continued", {"account": "c", "i": 0, "fail": True})
    first_try_placed(database_url, cont)
    behind_cont = app.enqueue("continued", {"account": "c", "i": 1})
    waiting = step_chain(
        app, "ordered", {"account": "s", "i": 0, "fail_first": True}, tries=3, retry_wait=3600
    )
    first_try_placed(database_url, waiting)
    behind_stop = app.enqueue("ordered", {"account": "s", "i": 1})

    wait_until(lambda: app.get_job(behind_cont).state == "succeeded", what="continued")
    (key,) = wait_until(lambda: [k for k in app.keys("held") if k.held_by], what="the hold")
    assert app.chain_status(held).state == "failed"
    assert (key.key, key.held_by, key.next_id) == ('"a"', f"{held}:post:1", behind_hold)
    wait_until(lambda: sql(database_url, STEP, (waiting,))[0][::2] == ("pending", True),
               what="the step waiting for its retry")  # fmt: skip
    # Both keys are stuck for good now (a hold, an hour's retry wait): only an operator or a
    # stop moves them, so their later jobs are still waiting whenever this is read.
    assert app.get_job(behind_hold).state == "queued"
    assert app.get_job(behind_stop).state == "queued"

    assert app.stop_chain(waiting)
    wait_until(lambda: app.get_job(behind_stop).state == "succeeded", what="stop gives on")
    assert app.chain_status(waiting).state in ("stopped", "failed")
    assert [k.held_by for k in app.keys("ordered")] == []
    assert app.release_key("held", '"a"') == f"{held}:post:1"
    wait_until(lambda: live_jobs(database_url) == 0, what="the held key's job done")
    report = check(
        database_url,
        ledger_dir,
        {"a": [behind_hold], "c": [behind_cont], "s": [behind_stop]},
        {},
    )
    assert report.ok, report
    assert report.runs == 2 + 2 + 2  # each key: the step's try, then the job behind it
    assert sql(database_url, "SELECT count(*) FROM hivejobs_sequence_place") == [(0,)]
