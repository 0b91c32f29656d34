"""The fetcher proves itself alive right before it pops, after flow control's read.

flow.room() reads the type's settings from Postgres and can block as long as a partition lasts;
a heartbeat check made before that read says nothing about the moment of the pop, and a claim
made then may land under a worker row the coordinator deleted meanwhile (rescued again: a
worker loss counted against each job it took).
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
