"""The peers harness's own logic (bench/peers/drivers/_common.py), never its timings."""

from __future__ import annotations

import ast
import asyncio
import importlib.util
import os
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import redis

from tests.harness import REDIS_URL, ROOT, RedisServer, wait_until


@pytest.fixture
def common(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """A fresh copy of _common whose counter keys live under a prefix of this test."""
    spec = importlib.util.spec_from_file_location(
        "peers_common", ROOT / "bench" / "peers" / "drivers" / "_common.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    prefix = f"hjtest:peers:{uuid.uuid4().hex[:8]}:"
    for name in ("DONE", "FIRST", "LAST", "LAT", "BATCHES", "RAN"):
        monkeypatch.setattr(module, name, prefix + getattr(module, name))
    monkeypatch.setenv(module.REDIS_URL_ENV, REDIS_URL)
    yield module
    client = redis.Redis.from_url(REDIS_URL)
    keys = list(client.scan_iter(match=prefix + "*"))
    if keys:
        client.delete(*keys)


def test_recorder_counts_every_completion_from_many_threads(common: ModuleType) -> None:
    client = redis.Redis.from_url(REDIS_URL)

    def worker(k: int) -> None:
        for i in range(250):
            enqueued = 1000.0 + k if i % 50 == 0 else 0.0  # 5 latency jobs per thread
            common.record(enqueued, 1000.5 + k, "sync")

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wait_until(lambda: int(client.get(common.DONE) or 0) >= 1000, what="1,000 completions")
    assert int(client.get(common.DONE) or 0) == 1000  # none counted twice
    assert float(client.get(common.FIRST) or 0) <= float(client.get(common.LAST) or 0)
    latencies = sorted(float(v) for v in client.lrange(common.LAT, 0, -1))
    assert latencies == [0.5] * 20  # handler start minus enqueue, latency jobs only
    assert client.hgetall(common.RAN) == {b"sync": b"1000"}


def test_a_batch_sent_twice_is_counted_once(common: ModuleType) -> None:
    """A retry after a lost reply resends the same token: the script skips it."""
    client = redis.Redis.from_url(REDIS_URL)
    script = client.register_script(common._FLUSH_LUA)
    keys = [common.DONE, common.FIRST, common.LAST, common.LAT, common.BATCHES, common.RAN]
    args: list[str | float] = ["token-1", 3, 1000.0, 1002.0, 2, "async", 2, "sync", 1, 0.25]
    assert script(keys=keys, args=args) == 1
    assert script(keys=keys, args=args) == 0
    assert int(client.get(common.DONE) or 0) == 3
    assert client.lrange(common.LAT, 0, -1) == [b"0.25"]
    assert client.hgetall(common.RAN) == {b"async": b"2", b"sync": b"1"}


def test_counter_retries_through_a_redis_restart(
    common: ModuleType,
    own_redis: RedisServer,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """Completions recorded while Redis is down are sent once it is back, none lost."""
    monkeypatch.setenv(common.REDIS_URL_ENV, own_redis.url)
    own_redis.stop()
    for _ in range(10):
        common.record(0.0, 1000.0, "sync")
    seen: list[str] = []

    def failed_once() -> bool:
        seen.append(capfd.readouterr().err)
        return "send failed, retry" in "".join(seen)

    wait_until(failed_once, what="the flusher to fail a send and retry")
    for _ in range(5):
        common.record(0.0, 1000.0, "sync")
    own_redis.start()  # empty: only what the flusher sends from now on is counted
    client = redis.Redis.from_url(own_redis.url)
    wait_until(lambda: int(client.get(common.DONE) or 0) >= 15, what="15 completions")
    assert int(client.get(common.DONE) or 0) == 15


def test_a_counter_that_cannot_send_fails_the_run(
    common: ModuleType,
    own_redis: RedisServer,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """After FLUSH_GIVE_UP_S of failed sends the driver's check raises, naming the error,
    instead of the run waiting for a count that never comes."""
    workers = common.Workers(tmp_path / "workers.log")
    monkeypatch.setenv(common.REDIS_URL_ENV, own_redis.url)
    monkeypatch.setenv(common.FLUSH_ERROR_FILE_ENV, str(workers.flush_errors))
    monkeypatch.setattr(common, "FLUSH_GIVE_UP_S", 0.5)
    own_redis.stop()
    workers.check_alive()  # nothing reported yet
    common.record(0.0, 1000.0, "sync")
    try:
        wait_until(workers.flush_errors.exists, what="the flusher to report that it stopped")
        with pytest.raises(RuntimeError, match=r"completion counter stopped.*ConnectionError"):
            workers.check_alive()
    finally:
        workers.stop()


@pytest.mark.parametrize(
    "jobs, has_bulk, expected",
    [(20_000, True, (5000, 15_000)), (2000, True, (1000, 1000)), (20_000, False, (20_000, 0))],
)
def test_split_enqueue(
    common: ModuleType, jobs: int, has_bulk: bool, expected: tuple[int, int]
) -> None:
    assert common.split_enqueue(jobs, has_bulk) == expected


def test_percentile_is_nearest_rank(common: ModuleType) -> None:
    values = [float(v) for v in range(1, 201)]
    assert common.percentile(values, 99) == 198.0
    assert common.percentile(values, 50) == 100.5


def ran_counts(common: ModuleType, total: int) -> dict[str, int]:
    """The counter's {body: jobs} once `total` jobs were counted."""
    client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    wait_until(lambda: int(client.get(common.DONE) or 0) >= total, what=f"{total} completions")
    return {str(k): int(v) for k, v in client.hgetall(common.RAN).items()}


def test_each_body_reports_what_it_ran(common: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """The blocking body on a thread is `sync`, the same body on a running event loop is
    `sync-in-loop`, an asyncio system's body is `async`, and its blocking variant runs in a
    thread (`sync`), never on the loop."""
    monkeypatch.setenv(common.WORK_ENV, "redis")
    monkeypatch.setenv(common.WORK_MS_ENV, "0.1")

    common.job(0.0)  # a worker thread of a thread system

    async def blocking_in_loop() -> None:
        common.job(0.0)

    asyncio.run(blocking_in_loop())

    async def asyncio_bodies(body: str, n: int) -> None:
        monkeypatch.setenv(common.BODY_ENV, body)
        await asyncio.gather(*(common.ajob(0.0) for _ in range(n)))

    asyncio.run(asyncio_bodies("async", 3))
    asyncio.run(asyncio_bodies("sync", 2))
    assert ran_counts(common, 7) == {"sync": 3, "sync-in-loop": 1, "async": 3}


def test_the_asyncio_body_leaves_its_loop_free_while_it_waits(
    common: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While one asyncio body waits, the loop runs other tasks (a blocking body would hold
    the loop for the whole 30 s). Its Redis call goes through one redis.asyncio client per
    process and loop, never the blocking client."""
    monkeypatch.setenv(common.BODY_ENV, "async")

    async def scenario() -> None:
        monkeypatch.setenv(common.WORK_ENV, "sleep")
        monkeypatch.setenv(common.WORK_MS_ENV, "30000")
        waiting = asyncio.create_task(common.ajob(0.0))
        await asyncio.sleep(0)  # the loop starts the body, which yields at its wait
        assert not waiting.done()  # we run again while it waits (blocking: 30 s later, done)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        monkeypatch.setenv(common.WORK_ENV, "redis")
        monkeypatch.setenv(common.WORK_MS_ENV, "0")
        await asyncio.gather(*(common.ajob(0.0) for _ in range(4)))

    asyncio.run(scenario())
    assert ran_counts(common, 4) == {"async": 4}
    assert common._work_client == [] and len(common._awork_client) == 1


def test_more_asyncio_bodies_at_once_than_links_all_finish(
    common: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A system that holds more jobs at once than the client has links (pgqueuer uncapped
    holds thousands) gets them all run: they queue for a link, none fails."""
    monkeypatch.setenv(common.BODY_ENV, "async")
    monkeypatch.setenv(common.WORK_ENV, "redis")
    monkeypatch.setenv(common.WORK_MS_ENV, "0")
    n = common.AWORK_MAX_CONNECTIONS + 50

    async def burst() -> None:
        await asyncio.gather(*(common.ajob(0.0) for _ in range(n)))

    asyncio.run(burst())
    assert ran_counts(common, n) == {"async": n}


ASYNCIO_DRIVERS = ("pgqueuer", "saq", "arq", "procrastinate")


@pytest.mark.parametrize("system", ASYNCIO_DRIVERS)
def test_an_asyncio_driver_awaits_the_asyncio_body(system: str) -> None:
    """The job of an asyncio system's driver is an `async def` that awaits `_common.ajob`,
    and nothing in the driver calls the blocking `_common.job` (which would run on its loop
    and serialise the worker to one job at a time)."""
    source = (ROOT / "bench" / "peers" / "drivers" / f"{system}_driver.py").read_text()
    calls = {
        node.func.attr
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "_common"
    }
    handlers = [
        node
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.AsyncFunctionDef)
        and any(
            isinstance(a, ast.Await)
            and isinstance(a.value, ast.Call)
            and isinstance(a.value.func, ast.Attribute)
            and a.value.func.attr == "ajob"
            for a in ast.walk(node)
        )
    ]
    assert handlers, f"{system}: no async def awaiting _common.ajob"
    assert "job" not in calls, f"{system} calls the blocking _common.job"
    assert load_run_py().SYSTEMS[system].native == ("async",)


def load_run_py() -> ModuleType:
    spec = importlib.util.spec_from_file_location("peers_run", ROOT / "bench" / "peers" / "run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def servers(own_redis: RedisServer, admin_url: str) -> Any:
    """run.py's Servers on a redis-server of this test's own (several dbs of it are used)."""
    return load_run_py().Servers(own_redis.url, admin_url, None)


def test_a_db_holding_someone_elses_keys_is_refused_and_kept(
    servers: Any, own_redis: RedisServer
) -> None:
    other = redis.Redis.from_url(own_redis.url.rsplit("/", 1)[0] + "/3")
    other.set("tenant:data", "kept")
    with pytest.raises(RuntimeError, match=r"redis db 3 at .* holds 1 keys: not touching it"):
        servers.claim(3)
    assert other.get("tenant:data") == b"kept" and other.dbsize() == 1


def test_an_empty_db_is_claimed_then_emptied_and_released(
    servers: Any, own_redis: RedisServer
) -> None:
    db = redis.Redis.from_url(own_redis.url.rsplit("/", 1)[0] + "/4")
    servers.claim(4)
    assert db.get("hivejobs-peers-bench:claim") == servers.me.encode()
    db.set("rq:job:1", "a peer's key")  # what the driver writes meanwhile
    servers.claim(4)  # the next repeat of the same run: still ours
    servers.release(4)
    assert db.dbsize() == 0


def test_a_db_claimed_by_another_live_run_is_refused(servers: Any, own_redis: RedisServer) -> None:
    db = redis.Redis.from_url(own_redis.url.rsplit("/", 1)[0] + "/5")
    db.set("hivejobs-peers-bench:claim", f"{socket.gethostname()}:{os.getppid()}")
    db.set("celery", "its queue")
    with pytest.raises(RuntimeError, match="is in use by peers bench run"):
        servers.claim(5)
    servers.release(5)  # not ours: release leaves it alone too
    assert db.dbsize() == 2


def test_a_db_left_by_a_dead_run_on_this_machine_is_taken_over(
    servers: Any, own_redis: RedisServer
) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    db = redis.Redis.from_url(own_redis.url.rsplit("/", 1)[0] + "/6")
    db.set("hivejobs-peers-bench:claim", f"{socket.gethostname()}:{gone.pid}")
    db.set("huey.tasks", "left by the dead run")
    servers.claim(6)
    assert db.dbsize() == 1 and db.get("hivejobs-peers-bench:claim") == servers.me.encode()


def test_peers_run_py_refuses_db_0(servers: Any) -> None:
    with pytest.raises(SystemExit, match="db 0 is never used"):
        servers.redis_cli(0, "PING")


def test_rows_run_each_systems_own_body_and_hivejobs_both() -> None:
    run = load_run_py()
    native = {name: run.bodies_for(system, "native") for name, system in run.SYSTEMS.items()}
    assert native["hivejobs"] == ("sync", "async")
    assert native["bare"] == ("sync", "async")  # the ceiling rows, one per body
    for name in ASYNCIO_DRIVERS:
        assert native[name] == ("async",)
    for name in ("dramatiq", "huey", "celery", "rq", "rq-fork"):
        assert native[name] == ("sync",)
    assert run.bodies_for(run.SYSTEMS["pgqueuer"], "sync") == ("sync",)  # in a thread
    assert run.bodies_for(run.SYSTEMS["dramatiq"], "async") == ("sync",)  # no asyncio API
    assert run.bodies_for(run.SYSTEMS["hivejobs"], "async") == ("async",)
    assert run.bodies_for(run.SYSTEMS["saq"], "both") == ("async", "sync")


@pytest.mark.parametrize(
    "body, ran, completions",
    [
        ("async", {"sync-in-loop": 20_200}, 20_200),  # a blocking body on the loop
        ("async", {"async": 20_000, "sync-in-loop": 200}, 20_200),
        ("sync", {"async": 20_200}, 20_200),
        ("async", {"async": 20_000}, 20_200),  # jobs that reported nothing
        ("async", {}, 20_200),
    ],
)
def test_a_run_whose_jobs_ran_another_body_is_refused(
    body: str, ran: dict[str, int], completions: int
) -> None:
    run = load_run_py()
    with pytest.raises(RuntimeError, match=f"asked for the {body} body, but the jobs ran"):
        run.check_ran({"ran": ran, "completions": completions}, body)
    run.check_ran({"ran": {body: completions}, "completions": completions}, body)
