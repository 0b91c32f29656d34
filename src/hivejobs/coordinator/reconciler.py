"""Reconciler (leader only): Redis lists from Postgres, so that Redis loses latency, never a
job (rule R1 in docs/concepts/reliability.md: Redis carries hints, Postgres the truth).

Two triggers: the boot marker is missing (Redis was flushed or restarted empty, or this is the
first start on its prefix: restore every empty list), or a queue's oldest queued row is older
than the id at the head of its Redis list, by more than the grace (a crash between commit
and push, a pool that died between pop and claim, an evicted key: re-push the ids queued
before that head). A list is first in, first out (RPUSH, pop from the left), so every id
pushed before the head has been popped; one still queued and older than the head by the
grace was lost. One id that is missing is found once its list has moved past it, where its
turn would have come, or at the next pass when the list is empty. Each pass reads an index
entry or two per queue and the heads by primary key, whatever the backlog (the
count of every queued row it replaced took 7 ms at 20,000 queued, and it re-pushed the
oldest ids, which were still in Redis, whenever ids popped and not yet claimed made the
count look short).

A fair type (`fair_by`, broker/fair.py) holds its ids in per-key lists too: its ids in Redis
begin at the oldest head of all its lists, read every FAIR_EVERY_S (a lookup per key).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta

import msgspec
from loguru import logger

from hivejobs.broker import Broker, KeyRefused
from hivejobs.broker.fair import fair_active, list_heads
from hivejobs.failpoints import failpoint
from hivejobs.logs import error_fields
from hivejobs.records import Lease, Push
from hivejobs.store import Store

BATCH = 10_000
# Ids read at the head of a list to find one still queued: an id whose job was claimed or
# cancelled meanwhile (a duplicate push) tells nothing; a head of only such ids is judged at
# a later pass, once a pool has popped them.
HEAD_IDS = 16
# The same for each per-key list of a fair type (broker/fair.py), fewer: there may be 10,000
# such lists, and each id read is a primary-key lookup at every pass.
FAIR_HEAD_IDS = 2
FAIR_EVERY_S = 5.0
MSG_KEY_REFUSED = "Redis refused a queue key (only its own list waits)"
MSG_KEY_ACCEPTED = "Redis key accepted again"
MSG_FLUSHED = "Redis had no boot marker (flushed or restarted): restored queues"
MSG_FIRST_START = "first start on this Redis prefix: boot marker set"


class ReconcileResult(msgspec.Struct):
    """What one pass did: a full restore (no boot marker) or a deficit re-push."""

    full_restore: bool = False
    pushed: int = 0


class Reconciler:
    """Owns `refused`: the keys Redis refused at the last pass, so that a bad key is logged
    when it goes bad and when it heals, not at every pass; and `_fair_due`, when the per-key
    lists of fair types are next read."""

    name = "reconcile"

    def __init__(
        self, store: Store, broker: Broker, grace_s: float = 2.0, interval_s: float = 1.0
    ) -> None:
        self.store, self.broker = store, broker
        self.grace_s = grace_s
        self.interval_s = interval_s
        self.refused: set[str] = set()
        self._fair_due = 0.0  # monotonic time of the next read of every per-key list's head

    def run_once(self, lease: Lease) -> ReconcileResult:
        if not self.broker.boot_marker_present():
            return ReconcileResult(True, self._restore_all())
        pushed = 0
        for queue, before in self._lagging().items():
            stale = self.store.stale_queued_if_leader(
                lease, queue, self.grace_s, BATCH, before=before
            )
            if stale is None:
                break  # the lease is lost: the next leader reconciles
            if stale:
                pushed += self._push(stale)
        if pushed:
            logger.info("re-pushed queued jobs missing from Redis", jobs=pushed)
        return ReconcileResult(False, pushed)

    def _lagging(self) -> dict[tuple[str, int], datetime | None]:
        """The queues with ids Redis lost, and the queued_at of their list's head (None: the
        list is empty). An id popped and not yet claimed is still queued and older than the
        head: it counts as lost only when older by more than the grace, and if it is pushed
        again anyway its claim fences the copy out (a duplicate id, never a second run)."""
        oldest = {(o.name, o.priority): o for o in self.store.oldest_queued(self.grace_s)}
        if not oldest:
            return {}
        heads, refused = self.broker.queue_heads(oldest, HEAD_IDS)
        self._note_refused(refused, answered=heads)
        # A fair type's ids also wait in per-key lists (broker/fair.py): the ids Redis holds
        # begin at the oldest of all its lists' heads (each list is in queue order). Reading
        # them all costs a lookup per key, so it is done every FAIR_EVERY_S; in between, a
        # type whose ring is in use is not judged (its repair waits that much longer).
        active = fair_active(self.broker, {name for name, _ in heads})
        fair: dict[tuple[str, int], list[list[str]]] = {}
        if active and time.monotonic() >= self._fair_due:
            fair = list_heads(self.broker, [q for q in heads if q[0] in active], FAIR_HEAD_IDS)
            self._fair_due = time.monotonic() + FAIR_EVERY_S
        elif active:
            heads = {q: ids for q, ids in heads.items() if q[0] not in active}
        lists = {q: [h for h in [ids, *fair.get(q, [])] if h] for q, ids in heads.items()}
        queued_at = self.store.queued_at_of([i for hs in lists.values() for h in hs for i in h])
        grace = timedelta(seconds=self.grace_s)
        lagging: dict[tuple[str, int], datetime | None] = {}
        for queue, held in lists.items():  # a refused key is not there: only its list waits
            if not held:
                if oldest[queue].past_grace:
                    lagging[queue] = None
                continue
            known = [at for ids in held if (at := _head_at(ids, queued_at)) is not None]
            head_at = min(known, default=None)
            if head_at is not None and oldest[queue].queued_at < head_at - grace:
                lagging[queue] = head_at
        return lagging

    def _lengths(self, names: set[str]) -> dict[tuple[str, int], int]:
        lengths, refused = self.broker.queue_lengths(names)
        self._note_refused(refused, answered=lengths)
        return lengths

    def _note_refused(
        self, refused: Mapping[str, Exception], answered: Iterable[tuple[str, int]]
    ) -> None:
        """Log a key when Redis starts refusing it and when it accepts it again. Only a key
        Redis `answered` for this pass is news: a refused key whose queue was not read (no
        queued row left) is still refused as far as anyone knows."""
        answered_keys = {self.broker.queue_key(n, p) for n, p in answered}
        for key, exc in refused.items():
            if key not in self.refused:
                logger.error(MSG_KEY_REFUSED, key=key, **error_fields(exc))
        for key in self.refused & answered_keys:
            logger.info(MSG_KEY_ACCEPTED, key=key)
        self.refused = (self.refused - answered_keys) | set(refused)

    def _push(self, entries: list[Push]) -> int:
        """Push one list's ids; a list Redis refuses fails alone (its rows were re-stamped
        queued_at = now(), so the next pass after the grace tries again)."""
        try:
            return self.broker.push_many(entries)
        except KeyRefused as exc:
            if exc.key not in self.refused:
                self.refused.add(exc.key)
                logger.error(MSG_KEY_REFUSED, key=exc.key, **error_fields(exc))
            return 0

    def _restore_all(self) -> int:
        """No boot marker: Redis was flushed or restarted empty, or this is the first start on
        this prefix. Push every queued id of each list that is empty, keyset-paged per queue
        (the queued index leads with the queue); a list that still holds ids (a first start
        after enqueues) is left to the deficit check, so a fresh Redis does not get every id
        twice. Postgres remembers each marker set (migration 0013): only then is a missing
        one news."""
        marker = str(uuid.uuid4())
        prefix = self.broker.prefix
        flushed = self.store.boot_marker_recorded(prefix)
        pg = self.store.queued_counts()
        failpoint("coord.between_restore_reads")  # tests: widen the window pools pop in
        lengths = self._lengths({name for name, _ in pg})
        empty = sorted(queue for queue in pg if lengths.get(queue, -1) == 0)
        pushed = 0
        for queue in empty:
            after: tuple[datetime, str] | None = None
            while True:
                rows = self.store.queued_page(queue, after, BATCH)
                if not rows:
                    break
                pushed += self._push([Push(r.id, r.name, r.priority) for r in rows])
                failpoint("coord.mid_reconcile_batch")
                after = (rows[-1].queued_at, rows[-1].id)
        self.broker.set_boot_marker(marker)
        self.store.record_boot_marker(prefix, marker)
        if flushed and pushed:
            logger.warning(MSG_FLUSHED, jobs=pushed)
        elif flushed:
            logger.info("Redis had no boot marker: nothing queued to restore; marker set")
        else:
            # A first start is no news, even with ids pushed: a job enqueued meanwhile may be
            # popped between the two reads above and pushed again (its claim fences it).
            logger.info(MSG_FIRST_START, jobs=pushed)
        return pushed


def _head_at(ids: list[str], queued_at: Mapping[str, datetime]) -> datetime | None:
    """When a list's first id still queued was queued (None: none of these is queued)."""
    return next((queued_at[i] for i in ids if i in queued_at), None)
