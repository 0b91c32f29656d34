"""The fetcher proves itself alive right before it pops, after flow control's read.

S15 (bench/chaos_partition.py) failed once so: the fetcher checked its heartbeat's age, then
flow.room() read the type's settings from Postgres and the partition held that read for
10 s; at the heal it popped and claimed at once, on a check made before the cut, under the
worker row the coordinator had deleted meanwhile (the claim was rescued: a worker loss
counted against each job it took).
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

from hivejobs.broker import Popped
from hivejobs.config import Settings
from hivejobs.store.flow import Room
from hivejobs.worker.fetcher import Fetcher


class HeldFlow:
    """flow.room() as a settings read a partition held: the heartbeat is stale when it ends."""

    concurrency = None

    def __init__(self, age: list[float], stopped: threading.Event) -> None:
        self.age = age
        self.stopped = stopped
        self.calls = 0

    def room(self, want: int) -> Room:
        self.calls += 1
        self.age[0] = 100.0  # the read returned after the coordinator declared us dead
        if self.calls > 1:
            self.stopped.set()
        return Room(allowed=want, wait_s=0.0, tokens=None)

    def scaled_concurrency(self) -> None:
        return None


class Broker:
    def __init__(self) -> None:
        self.pops: list[int] = []

    def pop(self, name: str, count: int) -> Popped:
        self.pops.append(count)
        return Popped("", [])

    def queue_keys_glob(self, name: str) -> str:
        return name


def test_no_pop_once_the_heartbeat_went_stale_during_flow_room() -> None:
    settings = Settings(database_url="postgresql://x/y", redis_url="redis://127.0.0.1:1/0")
    age = [0.0]  # a fresh heartbeat when the pass began
    stopped = threading.Event()
    broker = Broker()
    jt = SimpleNamespace(
        name="alo", delivery="at_least_once", limits=None, concurrency=2, fair=None
    )
    fetcher = Fetcher(
        jt,  # type: ignore[arg-type]
        "w",
        settings,
        None,  # type: ignore[arg-type]
        broker,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        threading.Event(),
        stopped,
        lambda: age[0],
        HeldFlow(age, stopped),  # type: ignore[arg-type]
        lambda concurrency: False,
    )
    timer = threading.Timer(2.0, stopped.set)  # ends the loop whatever it does
    timer.start()
    fetcher._run()  # noqa: SLF001 - the fetcher loop itself, in this thread
    timer.cancel()
    assert broker.pops == []
