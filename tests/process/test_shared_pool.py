"""Job types sharing one pool process (`pool="small"`), with a real `hivejobs run`.

tests/apps/poolapp.py: `one` (at-least-once, 1 runner), `two` (async, at-least-once, 2) and
`three` (at-most-once, 3) share pool "small"; `solo` has a process of its own. Handlers write
begin/end lines with the monotonic clock to the ledger, from which the tests count how many
of each type ran at once; gates hold them while the test looks or acts.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from hivejobs import App
from tests.apps.gate import open_gate
from tests.harness import Instance, fleet_app, live_jobs, pool_pids, read_ledger, sql, wait_until

APP = "tests.apps.poolapp:app"
SMALL = ["one", "two", "three"]


def begun(folder: Path) -> Counter[str]:
    """Attempts begun, per type."""
    return Counter(p[1] for p in read_ledger(folder) if p[0] == "begin")


def most_at_once(folder: Path, name: str, until_ns: int | None = None) -> int:
    """The most attempts of `name` running at once (begin to end), up to `until_ns`."""
    moments = []
    for p in read_ledger(folder):
        if p[1] == name and p[0] in ("begin", "end"):
            moments.append((int(p[4]), 1 if p[0] == "begin" else -1))
    running = most = 0
    for ns, step in sorted(moments, key=lambda m: (m[0], m[1])):  # an end first on a tie
        if until_ns is not None and ns > until_ns:
            break
        running += step
        most = max(most, running)
    return most


def children(pid: int) -> list[int]:
    """Live child processes of `pid` (from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().split(") ", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


def reported_bound(inst: Instance) -> tuple[int, int]:
    """(processes, Postgres connections) from the banner's footprint line."""
    found = wait_until(
        lambda: re.search(
            r"footprint +(\d+) processes, at most (\d+) Postgres connections", inst.log_text()
        ),
        what="the footprint line",
    )
    return int(found.group(1)), int(found.group(2))


def archived(url: str) -> list[tuple[str, str, int, str | None]]:
    return [
        (r[0], r[1], r[2], r[3])
        for r in sql(url, "SELECT name, state, attempt, error FROM hivejobs_archive ORDER BY 1")
    ]


def test_three_types_share_one_process_each_with_its_own_concurrency(
    start_instance: Callable[..., Instance],
    make_app: Callable[..., App],
    database_url: str,
    ledger_dir: Path,
) -> None:
    inst = start_instance(app_spec=APP)
    app = fleet_app(make_app, database_url, [*SMALL, "solo"])
    shared = pool_pids(database_url, "one")
    assert len(shared) == 1
    assert pool_pids(database_url, "two") == shared == pool_pids(database_url, "three")
    assert pool_pids(database_url, "solo") != shared
    # Supervisor, coordinator, pool small, solo; 1 + 4 + (5 + 4) + (3 + 4) connections.
    assert reported_bound(inst) == (4, 21)
    wait_until(lambda: len(children(inst.pid)) == 3, what="3 children: 2 pools, coordinator")
    for name in SMALL:
        app.enqueue_many(name, [{"gate": "g"}] * 6)
    # Each type fills its own runners, and only them, while the gate holds every handler.
    wait_until(
        lambda: begun(ledger_dir) == {"one": 1, "two": 2, "three": 3},
        what="1, 2 and 3 attempts begun",
    )
    # `hivejobs scale` reaches one lane of the shared process, and while every runner of
    # that lane is busy (its fetcher looks while it waits for room): a second `one` begins
    # with the gate still shut.
    scaled_at = time.monotonic_ns()
    app.scale("one", 2)
    wait_until(lambda: begun(ledger_dir)["one"] == 2, what="`one` scaled to 2 while full")
    open_gate(app.connections.broker, "g")
    wait_until(lambda: live_jobs(database_url) == 0, timeout=60, what="18 jobs done")
    assert Counter((r[0], r[1], r[2]) for r in archived(database_url)) == {
        ("one", "succeeded", 1): 6,
        ("two", "succeeded", 1): 6,
        ("three", "succeeded", 1): 6,
    }
    assert most_at_once(ledger_dir, "one", until_ns=scaled_at) == 1
    assert most_at_once(ledger_dir, "one") == 2
    assert most_at_once(ledger_dir, "two") == 2
    assert most_at_once(ledger_dir, "three") == 3
    assert {int(p[3]) for p in read_ledger(ledger_dir)} == set(shared)


# Each claim (queued -> running) and each end (a row archived) notes the commit mode its
# transaction is in: the synchronous_commit in force for that statement, and so at COMMIT;
# and the plan_cache_mode it was planned under.
COMMIT_MODE_NOTES = [
    "CREATE TABLE commit_mode (name text, event text, mode text, plans text)",
    """CREATE FUNCTION note_commit_mode() RETURNS trigger LANGUAGE plpgsql AS $$
       BEGIN
         INSERT INTO commit_mode VALUES (NEW.name, TG_ARGV[0],
                                         current_setting('synchronous_commit'),
                                         current_setting('plan_cache_mode'));
         RETURN NULL;
       END $$""",
    """CREATE TRIGGER claim_mode AFTER UPDATE ON hivejobs_job FOR EACH ROW
       WHEN (OLD.state = 'queued' AND NEW.state = 'running')
       EXECUTE FUNCTION note_commit_mode('claim')""",
    """CREATE TRIGGER end_mode AFTER INSERT ON hivejobs_archive FOR EACH ROW
       EXECUTE FUNCTION note_commit_mode('end')""",
]


def test_only_the_at_most_once_type_of_the_shared_process_commits_synchronously(
    start_instance: Callable[..., Instance],
    make_app: Callable[..., App],
    database_url: str,
    ledger_dir: Path,
) -> None:
    """An at-most-once claim or completion lost in a Postgres crash would let its job run
    again (or end it "worker lost"): `three` commits synchronously. `one` and `two`, in the
    same process and on the same connections, commit asynchronously, as they would alone.
    Every pool statement keeps its generic plan (under the default plan_cache_mode the archive
    statement would be planned afresh at each call)."""
    for statement in COMMIT_MODE_NOTES:
        sql(database_url, statement)
    start_instance(app_spec=APP)
    app = fleet_app(make_app, database_url, SMALL)
    for name in SMALL:
        app.enqueue_many(name, [{}] * 5)
    wait_until(lambda: live_jobs(database_url) == 0, timeout=60, what="15 jobs done")
    modes = Counter(
        (r[0], r[1], r[2]) for r in sql(database_url, "SELECT name, event, mode FROM commit_mode")
    )
    assert modes == {
        (name, event, "on" if name == "three" else "off"): 5
        for name in SMALL
        for event in ("claim", "end")
    }
    plans = sql(database_url, "SELECT DISTINCT plans FROM commit_mode")
    assert plans == [("force_generic_plan",)]
    # Each process's connections say which it is (pg_stat_activity, `hivejobs bench`).
    names = sql(
        database_url,
        "SELECT DISTINCT application_name FROM pg_stat_activity WHERE datname = current_database()",
    )
    assert {"hivejobs pool small", "hivejobs pool solo", "hivejobs coordinator"} <= {
        r[0] for r in names
    }


def test_sigterm_drains_every_type_of_the_shared_process_and_loses_none(
    start_instance: Callable[..., Instance],
    make_app: Callable[..., App],
    database_url: str,
    ledger_dir: Path,
) -> None:
    inst = start_instance(app_spec=APP)
    app = fleet_app(make_app, database_url, SMALL)
    app.enqueue_many("one", [{"gate": "later"}] * 3)  # 1 runs, held: suspended at the deadline
    app.enqueue_many("three", [{"gate": "now"}] * 4)  # 3 run, let through during the drain
    wait_until(lambda: begun(ledger_dir) == {"one": 1, "three": 3}, what="4 attempts begun")
    inst.signal_group(signal.SIGTERM)
    wait_until(
        lambda: "stopping: finishing running jobs" in inst.log_text(), what="the drain's start"
    )
    open_gate(app.connections.broker, "now")
    assert inst.wait(30) == 0
    states = Counter(r[0] for r in sql(database_url, "SELECT state FROM hivejobs_job"))
    assert states == {"queued": 4}  # 2 + the suspended one of `one`, the unstarted `three`
    assert Counter((r[0], r[1]) for r in archived(database_url)) == {("three", "succeeded"): 3}
    ends = [p for p in read_ledger(ledger_dir) if p[0] == "end" and p[1] == "one"]
    assert [p[5] for p in ends] == ["interrupted"]
    # The next instance runs what was left, the suspension not counted as an attempt.
    start_instance(app_spec=APP)
    open_gate(app.connections.broker, "later")
    wait_until(lambda: live_jobs(database_url) == 0, timeout=60, what="every job done")
    assert Counter((r[0], r[1], r[2]) for r in archived(database_url)) == {
        ("one", "succeeded", 1): 3,
        ("three", "succeeded", 1): 4,
    }


def test_kill_9_of_the_shared_process_releases_every_types_claims(
    start_instance: Callable[..., Instance],
    make_app: Callable[..., App],
    database_url: str,
    ledger_dir: Path,
) -> None:
    inst = start_instance(app_spec=APP)
    app = fleet_app(make_app, database_url, SMALL)
    app.enqueue_many("one", [{"gate": "g"}] * 2)
    app.enqueue_many("three", [{"gate": "g"}] * 3)
    wait_until(lambda: begun(ledger_dir) == {"one": 1, "three": 3}, what="4 attempts begun")
    [pid] = pool_pids(database_url, "one")
    os.kill(pid, signal.SIGKILL)
    # The supervisor releases both types' claims at once and forks the pool again.
    wait_until(
        lambda: "released jobs of a dead child {'requeued': 1, 'failed': 3}" in inst.log_text(),
        what="the claims of both types released",
    )
    wait_until(
        lambda: (p := pool_pids(database_url, "three")) and p != [pid], what="the pool forked again"
    )
    open_gate(app.connections.broker, "g")
    wait_until(lambda: live_jobs(database_url) == 0, timeout=60, what="every job done")
    # At-least-once: run again, the lost attempt counted; at-most-once: failed, never re-run.
    assert Counter((r[0], r[1], r[2], r[3]) for r in archived(database_url)) == {
        ("one", "succeeded", 1, None): 1,
        ("one", "succeeded", 2, "worker lost"): 1,
        ("three", "failed", 1, "worker lost"): 3,
    }
    assert begun(ledger_dir) == {"one": 3, "three": 3}


def test_thirty_types_in_one_process_stay_under_the_reported_connection_bound(
    start_instance: Callable[..., Instance],
    make_app: Callable[..., App],
    database_url: str,
    ledger_dir: Path,
) -> None:
    types = [f"m{i}" for i in range(30)]
    inst = start_instance({"HJ_MANY": "30", "HJ_MANY_POOL": "small"}, app_spec=APP)
    # Supervisor, coordinator, one pool process: 1 + 4 + (6 + 4).
    assert reported_bound(inst) == (3, 15)
    app = fleet_app(make_app, database_url, types)
    assert len(set(pool_pids(database_url, "m0") + pool_pids(database_url, "m29"))) == 1
    wait_until(lambda: len(children(inst.pid)) == 2, what="2 children: a pool, the coordinator")

    def connections() -> int:
        rows = sql(
            database_url,
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid()",
        )
        return int(rows[0][0]) - 1  # minus the test's own App (its store: 1)

    for name in types:
        app.enqueue_many(name, [{"gate": "g", "ms": 20}] * 6)
    # Every lane busy at once: 2 runners of each of the 30 types held at the gate.
    wait_until(lambda: sum(begun(ledger_dir).values()) == 60, what="60 attempts begun")
    peak = connections()
    open_gate(app.connections.broker, "g")
    while live_jobs(database_url):
        peak = max(peak, connections())
        time.sleep(0.05)  # the sampling interval, not a synchronisation
    assert 0 < peak <= 15, peak
    assert Counter(r[1] for r in archived(database_url)) == {"succeeded": 180}


def test_a_shared_pool_over_its_memory_cap_is_recycled_with_every_type(
    start_instance: Callable[..., Instance],
    make_app: Callable[..., App],
    database_url: str,
    ledger_dir: Path,
) -> None:
    inst = start_instance({"HJ_MAX_RSS": "250"}, app_spec=APP)
    app = fleet_app(make_app, database_url, ["hog", "one", "two"])
    app.enqueue_many("hog", [{"mb": 40, "ms": 300}] * 12)  # 480 MiB leaked in all
    app.enqueue_many("one", [{"ms": 300}] * 12)
    app.enqueue_many("two", [{"ms": 300}] * 12)  # an `async def` handler in the same pool
    wait_until(lambda: live_jobs(database_url) == 0, timeout=90, what="36 jobs done")
    assert "memory cap passed: recycling the pool" in inst.log_text()
    pids = {
        name: {p[3] for p in read_ledger(ledger_dir) if p[1] == name}
        for name in ("hog", "one", "two")
    }
    assert len(pids["hog"]) >= 2  # recycled at least once (12 x 40 MiB cannot fit under 250)
    assert pids["hog"] & pids["one"] & pids["two"]  # the types ran in the same processes
    # Nothing failed, nothing was charged a second attempt: recycling suspends.
    assert Counter((r[0], r[1], r[2]) for r in archived(database_url)) == {
        ("hog", "succeeded", 1): 12,
        ("one", "succeeded", 1): 12,
        ("two", "succeeded", 1): 12,
    }
