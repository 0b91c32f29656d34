"""Chaos scenarios on the enqueue side (RELIABILITY.md S7 duplicate ids, S9 bad input, S12
burst): many client processes and threads against one running instance.

Client processes are started with the spawn method (no fork of a threaded parent); their
functions live at module level so they can be pickled.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime, timedelta

import psycopg
import redis
from bench.chaoslib import ROOT, Row, Scenario, scaled
from bench.harness import FAST_SETTINGS, ledger_starts, pool_pids, sql, wait_until

from hivejobs import (
    App,
    Chain,
    ChainInvalid,
    HivejobsError,
    InvalidArgument,
    JobIdConflict,
    PayloadInvalid,
    PayloadTooLarge,
    UnknownJobType,
)
from hivejobs.bench.percentiles import percentiles

SPAWN = multiprocessing.get_context("spawn")


def _client_app(url: str, redis_url: str, prefix: str) -> App:
    app = App(database_url=url, redis_url=redis_url, prefix=prefix, testing=None, **FAST_SETTINGS)
    app.types.clear()
    return app


def dup_client(url: str, redis_url: str, prefix: str, ids: list[str], threads: int) -> list[str]:
    """S7 client process: `threads` threads each enqueue every id (same payload) in the same
    order, so calls for one id collide. Returns problems."""
    app = _client_app(url, redis_url, prefix)
    problems: list[str] = []

    def work() -> None:
        for i, job_id in enumerate(ids):
            try:
                got = app.enqueue("alo", {"ms": 5, "n": i}, id=job_id)
            except HivejobsError as exc:
                problems.append(f"{job_id}: {exc!r}")
                continue
            if got != job_id:
                problems.append(f"{job_id}: returned {got}")

    pool = [threading.Thread(target=work) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    app.close()
    return problems


def duplicate_ids(scale: float) -> Row:
    """S7: each id enqueued 16 times at once (2 processes x 8 threads); conflicting payloads;
    rolled-back transactional enqueues; ids re-enqueued after their job was archived."""
    s = Scenario("S7 duplicate ids x16")
    try:
        s.instance("alo")
        app = s.app(["alo"])
        n = scaled(10_000, scale, 50)
        ids = [f"dup-{i}" for i in range(n)]
        with ProcessPoolExecutor(2, mp_context=SPAWN) as ex:
            futures = [ex.submit(dup_client, s.url, s.redis_url, s.prefix, ids, 8) for _ in "ab"]
            problems = [p for f in futures for p in f.result(timeout=600)]
        s.check(not problems, f"{len(problems)} duplicate calls misbehaved: {problems[:2]}")

        # A different payload under a taken id: JobIdConflict, nothing changed.
        conflicting = ids[: scaled(100, scale, 10)]
        before = _payloads(s.url, conflicting)
        refused = 0
        for job_id in conflicting:
            try:
                app.enqueue("alo", {"ms": 5, "n": -1}, id=job_id)
            except JobIdConflict:
                refused += 1
        s.check(refused == len(conflicting), f"{len(conflicting) - refused} conflicts accepted")
        s.check(_payloads(s.url, conflicting) == before, "a conflicting enqueue changed a payload")

        # Enqueued in a transaction that rolls back: never stored, never run; then committed.
        rolled = [f"rolled-{i}" for i in range(scaled(200, scale, 10))]
        with psycopg.connect(s.url) as conn:
            conn.execute("SELECT 1")  # the caller's transaction is open (an idle one commits)
            for job_id in rolled:
                app.enqueue("alo", {"ms": 1}, id=job_id, conn=conn)
            conn.rollback()
        s.check(not _payloads(s.url, rolled), "a rolled-back enqueue was stored")
        with psycopg.connect(s.url) as conn:
            conn.execute("SELECT 1")  # the caller's transaction is open (an idle one commits)
            for job_id in rolled:
                app.enqueue("alo", {"ms": 1}, id=job_id, conn=conn)
            conn.commit()

        # Re-enqueued after it succeeded and was archived: the finished job's id, no re-run.
        again = ids[: scaled(50, scale, 5)]
        wait_until(
            lambda: sql(
                s.url,
                "SELECT count(*) = %s FROM hivejobs_archive WHERE id = ANY(%s)",
                (len(again), again),
            )[0][0],
            timeout=120,
            what="the first jobs archived",
        )
        for i, job_id in enumerate(again):
            s.check(app.enqueue("alo", {"ms": 5, "n": i}, id=job_id) == job_id, "re-enqueue id")
        row = s.result(alo=ids + rolled)
        starts = ledger_starts(s.ledger)
        extra = [i for i in ids + rolled if starts[i] != 1]
        total = sql(s.url, "SELECT count(*) FROM hivejobs_archive")[0][0]
        s.check(total == n + len(rolled), f"{total} jobs stored, expected {n + len(rolled)}")
        s.check(not extra, f"{len(extra)} jobs started other than once, e.g. {extra[:3]}")
        return s.rejudge(row, twice=len(extra), notes=f"{16 * n} duplicate calls")
    finally:
        s.close()


def _payloads(url: str, ids: list[str]) -> dict[str, bytes]:
    rows = sql(
        url,
        "SELECT id, payload FROM hivejobs_job WHERE id = ANY(%(ids)s) "
        "UNION ALL SELECT id, payload FROM hivejobs_archive WHERE id = ANY(%(ids)s)",
        {"ids": ids},
    )
    return {r[0]: bytes(r[1]) for r in rows}


# -- S9 --------------------------------------------------------------------------------


# Cases known to fail, by label, with the issue that reports them ("known:" in their rows;
# the CI test lets them pass). The last six (NaN, Infinity, depth 100,000, RTL-override id,
# get_job NUL, CLI deep JSON) are fixed, so none is expected now.
KNOWN_BAD_INPUT: dict[str, str] = {}


def _problem(s: Scenario, label: str, text: str) -> None:
    known = KNOWN_BAD_INPUT.get(label)
    s.problems.append(f"{'known: ' if known else ''}{label}: {text}")


def _refused(
    s: Scenario, label: str, call: Callable[..., object], error: type[Exception], text: str
) -> bool:
    """Run a case that must be refused with `error` whose message holds `text`; True if it
    was accepted (it stored a job)."""
    try:
        call()
    except error as exc:
        if text not in str(exc):
            _problem(s, label, f"message {str(exc)[:120]!r} lacks {text!r}")
        return False
    except BaseException as exc:  # noqa: BLE001 - the wrong error is the finding
        _problem(s, label, f"raised {type(exc).__name__} ({str(exc)[:80]}), not {error.__name__}")
        return False
    _problem(s, label, "accepted")
    return True


def _snapshot(s: Scenario) -> tuple[object, ...]:
    counts = sql(
        s.url,
        "SELECT (SELECT count(*) FROM hivejobs_job), (SELECT count(*) FROM hivejobs_archive),"
        " (SELECT count(*) FROM hivejobs_chain)",
    )[0]
    client = redis.Redis.from_url(s.redis_url)
    lists = {
        k: client.llen(k)
        for k in client.scan_iter(match=s.prefix + "*", count=1000)
        if client.type(k) == b"list"
    }
    client.close()
    return counts, sorted(lists.items())


def bad_input(scale: float) -> Row:
    """S9: every refusal has its own error class and message, and stores nothing; a stored
    payload that no longer decodes fails its attempt without crashing the pool."""
    s = Scenario("S9 bad input")
    try:
        s.instance("alo,typed,poison")
        app = s.app(["alo", "typed", "poison"])
        # A client that imports the handlers knows the payload schema (the declared types
        # alone do not carry it).
        from tests.apps import faultapp

        app.job("typed", concurrency=2, attempts=3)(faultapp.typed)
        alo_pid = pool_pids(s.url, "alo")[0]
        typed_pid = pool_pids(s.url, "typed")[0]
        before = _snapshot(s)
        limit = app.settings.max_payload_bytes
        cases = _api_cases(app, limit)
        stored = sum(_refused(s, label, call, error, text) for label, call, error, text in cases)
        for label, chain, text in _chain_cases():
            _refused(s, f"chain {label}", lambda c=chain: app.run_chain(c), ChainInvalid, text)
        cli = _cli_cases(s)
        after = _snapshot(s)
        if stored:  # accepted cases were reported above; each stored one job
            counts, was = after[0], before[0]
            s.check(
                sum(counts[:2]) == sum(was[:2]) + stored and counts[2] == was[2],  # type: ignore[index]
                f"refused input changed the store: {was} -> {counts}",
            )
        else:
            s.check(after == before, f"refused input changed the store or Redis: {after}")

        # Accepted edge cases run once: exactly the size limit, ids with {}, : and emoji.
        accepted = [app.enqueue("poison", {"do": "ok", "s": "x" * (limit - 18)})]
        accepted += [app.enqueue("alo", {"ms": 1}, id=i) for i in ("{a}", "a:b", "job-\U0001f600")]
        # Schema drift: a stored payload that no longer fits its type, pushed by hand.
        drift = "drifted"
        sql(
            s.url,
            "INSERT INTO hivejobs_job (id, name, state, attempts, delivery, payload, queued_at)"
            " VALUES (%s, 'typed', 'queued', 3, 'at_least_once', %s, now())",
            (drift, b'{"width": "wide"}'),
        )
        app.connections.broker.push("typed", 0, [drift])
        # Garbage in a Redis list: skipped, logged, nothing crashes.
        key = app.connections.broker.queue_key("alo", 0)
        app.connections.broker.redis.rpush(
            key, *[os.urandom(8).hex() for _ in range(scaled(10_000, scale))]
        )
        app.connections.broker.redis.rpush(key, b"x" * (10 * 1024 * 1024))
        row = s.result(
            alo=accepted,
            expected={drift: lambda f: f[0] == "failed" and f[1] == 1 and "decode" in f[2]},
            jobs=len(cases) + len(cli) + 5,
        )
        s.check(pool_pids(s.url, "alo") == [alo_pid], "the alo pool was restarted")
        s.check(pool_pids(s.url, "typed") == [typed_pid], "the typed pool was restarted")
        return s.rejudge(row, notes=f"{len(cases)} API, {len(cli)} CLI, 7 chain cases")
    finally:
        s.close()


def _api_cases(
    app: App, limit: int
) -> list[tuple[str, Callable[[], object], type[Exception], str]]:
    deep: list[object] = []
    for _ in range(100_000):
        deep = [deep]
    now = datetime.now(UTC)
    e = app.enqueue
    return [
        ("missing field", lambda: e("typed", {"width": 1}), PayloadInvalid, "`height`"),
        (
            "wrong type",
            lambda: e("typed", {"width": "1", "height": 1}),
            PayloadInvalid,
            "Expected `int`, got `str` - at `$.width`",
        ),
        (
            "extra field",
            lambda: e("typed", {"width": 1, "height": 1, "depth": 1}),
            PayloadInvalid,
            "unknown field `depth`",
        ),
        ("not JSON", lambda: e("alo", {"x": object()}), PayloadInvalid, "not JSON-serialisable"),
        ("NaN", lambda: e("alo", {"x": float("nan")}), PayloadInvalid, "NaN"),
        ("Infinity", lambda: e("alo", {"x": float("inf")}), PayloadInvalid, "inf"),
        ("depth 100,000", lambda: e("alo", {"x": deep}), PayloadInvalid, "deep"),
        (
            "limit + 1 byte",
            lambda: e("poison", {"do": "ok", "s": "x" * (limit - 17)}),
            PayloadTooLarge,
            str(limit),
        ),
        ("100 MiB", lambda: e("alo", {"s": "x" * (100 << 20)}), PayloadTooLarge, str(limit)),
        ("unknown type", lambda: e("nosuch", {}), UnknownJobType, "unknown job type 'nosuch'"),
        ("256-char id", lambda: e("alo", {}, id="x" * 256), InvalidArgument, "1-255"),
        ("newline id", lambda: e("alo", {}, id="a\nb"), InvalidArgument, "control"),
        ("NUL id", lambda: e("alo", {}, id="a\x00b"), InvalidArgument, "control"),
        ("RTL-override id", lambda: e("alo", {}, id="a\u202eb"), InvalidArgument, "character"),
        ("priority 10", lambda: e("alo", {}, priority=10), InvalidArgument, "0-9"),
        ("priority -1", lambda: e("alo", {}, priority=-1), InvalidArgument, "0-9"),
        ("delay < 0", lambda: e("alo", {}, delay=-1), InvalidArgument, "between 0"),
        ("delay NaN", lambda: e("alo", {}, delay=float("nan")), InvalidArgument, "between 0"),
        ("delay 1e12", lambda: e("alo", {}, delay=1e12), InvalidArgument, "between 0"),
        (
            "naive run_at",
            lambda: e("alo", {}, run_at=datetime.now()),  # noqa: DTZ005 - the case
            InvalidArgument,
            "timezone-aware",
        ),
        (
            "expires_at < now",
            lambda: e("alo", {}, expires_at=now - timedelta(seconds=1)),
            InvalidArgument,
            "in the past",
        ),
        (
            "batch with one bad",
            lambda: app.enqueue_many("alo", [{"ms": 1}] * 9_999 + [{"x": object()}]),
            PayloadInvalid,
            "not JSON-serialisable",
        ),
        ("get_job NUL", lambda: app.get_job("a\x00b"), InvalidArgument, "control"),
    ]


def _chain_cases() -> list[tuple[str, Chain, str]]:
    cycle = Chain("cycle")
    cycle.job("alo", key="a", after=["c"])
    cycle.job("alo", key="b", after=["a"])
    cycle.job("alo", key="c", after=["b"])
    own = Chain("self")
    own.job("alo", key="a", after=["a"])
    unknown = Chain("unknown")
    unknown.job("nosuch", key="x")
    dangling = Chain("dangling")
    dangling.job("alo", key="a", after=["nope"])
    loose = Chain("loose")
    a = loose.job("alo", key="a")
    b = loose.job("alo", key="b", after=[a])
    c = loose.job("alo", key="c", after=[a])
    d = loose.job("alo", key="d", after=[c])
    loose.sequence([a, b, d], retries=1)
    huge = Chain("huge")
    for i in range(100_001):
        huge.job("alo", key=f"j{i}")
    return [
        ("cycle", cycle, "a -> b -> c -> a"),
        ("self-dependency", own, "a -> a"),
        ("unknown type", unknown, "unknown job type 'nosuch'"),
        ("dangling after", dangling, "not a job of this chain"),
        ("empty", Chain("empty"), "empty"),
        ("disconnected sequence", loose, "exactly one start job"),
        ("100,001 jobs", huge, "100000"),
    ]


def _cli_cases(s: Scenario) -> list[str]:
    """`hivejobs enqueue` with bad input: exit 2 and one line on stderr, nothing stored."""
    env = s.env("")
    env["PYTHONPATH"] = str(ROOT / "src")
    cases = {
        "bad JSON": ["alo", "{bad"],
        "unknown type": ["nosuch", "{}"],
        "priority 10": ["alo", "{}", "--priority", "10"],
        "newline id": ["alo", "{}", "--id", "a\nb"],
        "deep JSON": ["alo", "[" * 2000 + "]" * 2000],
    }
    for label, argv in cases.items():
        proc = subprocess.run(
            [sys.executable, "-m", "hivejobs", "enqueue", *argv],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        lines = proc.stderr.strip().splitlines()
        if not (proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr):
            _problem(
                s,
                f"CLI {label}",
                f"exit {proc.returncode}, {len(lines)} stderr lines ({(lines or [''])[-1][:80]!r})",
            )
    return list(cases)


# -- S12 -------------------------------------------------------------------------------


def burst_client(
    url: str, redis_url: str, prefix: str, name: str, calls: int, threads: int, batches: int
) -> tuple[list[str], list[float], int]:
    """S12 client process: `threads` threads of single enqueues, or `batches` enqueue_many
    calls of `calls` jobs. Returns (ids, single-call latencies in s, errors)."""
    app = _client_app(url, redis_url, prefix)
    ids: list[str] = []
    latencies: list[float] = []
    errors = 0
    lock = threading.Lock()

    def singles() -> None:
        nonlocal errors
        mine, lat, bad = [], [], 0
        for _ in range(calls):
            t = time.perf_counter()
            try:
                mine.append(app.enqueue(name, {"ms": 1}))
            except HivejobsError:
                bad += 1
            lat.append(time.perf_counter() - t)
        with lock:
            ids.extend(mine)
            latencies.extend(lat)
            errors += bad

    if batches:
        for _ in range(batches):
            ids += app.enqueue_many(name, [{"ms": 1}] * calls)
    else:
        pool = [threading.Thread(target=singles) for _ in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
    app.close()
    return ids, latencies, errors


def burst(scale: float) -> Row:
    """S12: 4 processes x 2 threads of single enqueues plus one process of enqueue_many, all
    at once, into 2 types x concurrency 8. Reports enqueue and enqueue-to-start latencies,
    the peak Redis list length and the peak Postgres connections."""
    s = Scenario("S12 burst")
    try:
        s.instance("alo,amo", HJ_CONCURRENCY_AMO="8")
        app = s.app(["alo", "amo"])
        single = scaled(3125, scale, 10)
        many = scaled(5000, scale, 10)
        peaks = {"list": 0, "conns": 0}
        stop = threading.Event()

        def sample() -> None:
            keys = [app.connections.broker.queue_key(t, 0) for t in ("alo", "amo")]
            while not stop.wait(0.1):
                peaks["list"] = max(
                    [peaks["list"], *(app.connections.broker.redis.llen(k) for k in keys)]
                )
                conns = sql(
                    s.url,
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()",
                )[0][0]
                peaks["conns"] = max(peaks["conns"], int(conns))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        begun = time.monotonic()
        with ProcessPoolExecutor(5, mp_context=SPAWN) as ex:
            args = (s.url, s.redis_url, s.prefix)
            futures = [
                ex.submit(burst_client, *args, ("alo", "amo")[i % 2], single, 2, 0)
                for i in range(4)
            ]
            futures.append(ex.submit(burst_client, *args, "alo", many, 0, 5))
            results = [f.result(timeout=900) for f in futures]
        enqueued = time.monotonic() - begun
        alo = [i for r in results for i in r[0]]
        latencies = sorted(x for r in results for x in r[1])
        errors = sum(r[2] for r in results)
        s.check(errors == 0, f"{errors} enqueue errors")
        try:
            row = s.result(alo=alo, timeout=600)
        finally:
            stop.set()
            sampler.join(5)
        waits = sql(
            s.url,
            "SELECT percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP "
            "(ORDER BY extract(epoch FROM started_at - created_at)) FROM hivejobs_archive",
        )[0][0]
        p50, p99 = (v * 1000 for v in percentiles(latencies, 50, 99))
        notes = (
            f"enqueue p50 {p50:.1f} ms p99 {p99:.1f} ms ({len(alo) / enqueued:.0f}/s); "
            f"enqueue-to-start p50 {waits[0]:.2f} s p99 {waits[1]:.2f} s; "
            f"peak list {peaks['list']}, peak PG conns {peaks['conns']}"
        )
        return s.rejudge(row, notes=notes)
    finally:
        s.close()
