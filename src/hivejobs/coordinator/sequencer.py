"""Sequencer (leader only): the repair of sequences per key (sequence.py), as the reconciler
is the repair of Redis.

A job waiting for its key is parked (out of Redis, out of the reconciler's view) and the
hand-over trigger unparks it in the transaction that ends the key's previous job, so a key
never waits with nothing ahead of it. Should some path ever leave a key's next job parked
with no hold and nothing of the key running, that job would wait for ever: each pass finds
such keys (an index entry or two per key with live jobs, every 10 s) and hands them over
under their lock, as the trigger would have. Never starts anything itself: the claim's
guard still decides.
"""

from __future__ import annotations

from loguru import logger

from hivejobs.broker import Broker
from hivejobs.records.dispatch import Lease
from hivejobs.store import Store
from hivejobs.store.sequence import SequenceStore

MSG_STALLED = "sequence keys found stalled and handed over (the trigger missed them)"


class Sequencer:
    """Owns nothing but its settings: each pass reads Postgres afresh."""

    name = "sequencer"

    def __init__(self, store: Store, broker: Broker, interval_s: float = 5.0) -> None:
        self.sequences = SequenceStore(store)
        self.broker = broker
        self.interval_s = interval_s

    def run_once(self, lease: Lease | None = None) -> int:
        """One pass; returns how many keys it handed over. `lease` is not needed: a hand-over
        under the key's lock is right whoever makes it."""
        pushes = self.sequences.hand_over_stalled()
        if pushes:
            logger.warning(MSG_STALLED, jobs=len(pushes), job_type=pushes[0][1])
            self.broker.push_many(pushes)
        return len(pushes)
