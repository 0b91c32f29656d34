"""The peers harness's own logic (bench/peers/drivers/_common.py), never its timings."""

from __future__ import annotations

import importlib.util
import threading
import uuid
from collections.abc import Iterator
from types import ModuleType

import pytest
import redis

from tests.harness import REDIS_URL, ROOT, wait_until


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
    for name in ("DONE", "FIRST", "LAST", "LAT"):
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
            common.record(enqueued, 1000.5 + k)

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
