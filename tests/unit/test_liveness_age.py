"""A heartbeat's age counts from when it was sent, not from when its answer came back.

An answer a partition held proves the pool was alive when the heartbeat was sent, nothing
later: dated from its arrival it would make a pool the coordinator declared dead meanwhile
look alive, and its fetcher would claim under the deleted worker row.
"""

from __future__ import annotations

import time
from typing import Any

from hivejobs.config import Settings
from hivejobs.worker.liveness import Liveness, Tracked
from hivejobs.worker.shutdown import Stop

ROUND_TRIP_S = 0.4


class SlowAnswerStore:
    """A store whose heartbeat is accepted at once and answered ROUND_TRIP_S later."""

    def __init__(self) -> None:
        self.liveness: Liveness | None = None

    def heartbeat_all(self, worker_ids: list[str]) -> bool:
        time.sleep(ROUND_TRIP_S)
        assert self.liveness is not None
        self.liveness._stopped.set()  # noqa: SLF001 - one heartbeat only
        return True


def test_heartbeat_age_counts_from_the_send() -> None:
    store = SlowAnswerStore()
    settings = Settings(database_url="postgresql://x/y", redis_url="redis://127.0.0.1:1/0")
    lane = Tracked(worker_id="w", claims=Any, slots=Any, check_untracked=False)  # type: ignore[arg-type]
    liveness = Liveness(["alo"], [lane], settings, store, None, Stop())  # type: ignore[arg-type]
    store.liveness = liveness
    liveness._heartbeat()  # noqa: SLF001 - the heartbeat loop itself, one pass
    # The answer just arrived, but it proves us alive only as of its sending.
    assert liveness.heartbeat_age_s() >= ROUND_TRIP_S * 0.9
