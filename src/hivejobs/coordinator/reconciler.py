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

A fair type (`fair_by`, broker/fair.py) holds its ids in per-key lists too, each in queue
order: the same rule holds per key. Its queue is judged only when its oldest row is past the
grace, and then from its oldest queued rows alone: each row's key is read from its payload,
only those keys' lists are read, and a row older than its own key's head (and than the
inbox's) by the grace was lost. A pass costs a page of rows and a list head per row, however
many keys the ring holds; it reads further only while a whole page was lost (a lost ring).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta

import msgspec
from loguru import logger

from hivejobs.broker import Broker, KeyRefused
from hivejobs.broker.fair import key_heads
from hivejobs.failpoints import failpoint
from hivejobs.logs import error_fields
from hivejobs.records.dispatch import KeyedQueued, Lease, Push
from hivejobs.store import Store

BATCH = 10_000
# Ids read at the head of a list to find one still queued: an id whose job was claimed or
# cancelled meanwhile (a duplicate push) tells nothing; a head of only such ids is judged at
# a later pass, once a pool has popped them.
HEAD_IDS = 16
# The same for the list of each key of a fair type's oldest rows (broker/fair.py), fewer: each
# id read is a primary-key lookup, and a page of rows may name as many keys.
FAIR_HEAD_IDS = 2
# A fair queue's oldest rows judged per page: each names a key whose list is read.
FAIR_PAGE = 64
# A fair queue to judge key by key: its type's fair_by field, its inbox head's queued_at.
FairQueue = tuple[str, datetime | None]
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
    when it goes bad and when it heals, not at every pass."""

    name = "reconcile"

    def __init__(
        self, store: Store, broker: Broker, grace_s: float = 2.0, interval_s: float = 1.0
    ) -> None:
        self.store, self.broker = store, broker
        self.grace_s = grace_s
        self.interval_s = interval_s
        self.refused: set[str] = set()

    def run_once(self, lease: Lease) -> ReconcileResult:
        if not self.broker.boot_marker_present():
            return ReconcileResult(True, self._restore_all())
        pushed = 0
        lagging, fair = self._lagging()
        for queue, before in lagging.items():
            stale = self.store.stale_queued_if_leader(
                lease, queue, self.grace_s, BATCH, before=before
            )
            if stale is None:
                break  # the lease is lost: the next leader reconciles
            if stale:
                pushed += self._push(stale)
        for queue, (field, inbox_at) in fair.items():
            repushed = self._repair_fair(lease, queue, field, inbox_at)
            if repushed is None:
                break  # the lease is lost
            pushed += repushed
        if pushed:
            logger.info("re-pushed queued jobs missing from Redis", jobs=pushed)
        return ReconcileResult(False, pushed)

    def _lagging(
        self,
    ) -> tuple[dict[tuple[str, int], datetime | None], dict[tuple[str, int], FairQueue]]:
        """The queues with ids Redis lost, and the queued_at of their list's head (None: the
        list is empty); and the fair queues to judge key by key (_repair_fair), with their
        field and their inbox head's queued_at. An id popped and not yet claimed is still
        queued and older than the head: it counts as lost only when older by more than the
        grace, and if it is pushed again anyway its claim fences the copy out (a duplicate id,
        never a second run)."""
        oldest = {(o.name, o.priority): o for o in self.store.oldest_queued(self.grace_s)}
        if not oldest:
            return {}, {}
        heads, refused = self.broker.queue_heads(oldest, HEAD_IDS)
        self._note_refused(refused, answered=heads)
        fields = self.store.fair_fields()
        queued_at = self.store.queued_at_of([i for ids in heads.values() for i in ids])
        grace = timedelta(seconds=self.grace_s)
        lagging: dict[tuple[str, int], datetime | None] = {}
        fair: dict[tuple[str, int], FairQueue] = {}
        for queue, ids in heads.items():  # a refused key is not there: only its list waits
            head_at = _head_at(ids, queued_at)
            if queue[0] in fields:
                # Its ids wait in per-key lists too: judged from its oldest rows, past the
                # grace only (a younger one cannot be lost yet); an inbox whose head holds
                # only ids no longer queued is judged at a later pass, as a list is.
                if oldest[queue].past_grace and (head_at is not None or not ids):
                    fair[queue] = (fields[queue[0]], head_at)
            elif not ids:
                if oldest[queue].past_grace:
                    lagging[queue] = None
            elif head_at is not None and oldest[queue].queued_at < head_at - grace:
                lagging[queue] = head_at
        return lagging, fair

    def _repair_fair(
        self, lease: Lease, queue: tuple[str, int], field: str, inbox_at: datetime | None
    ) -> int | None:
        """Push again the oldest rows of a fair queue that no list holds (lost_rows), a page at
        a time; the next page only while a whole page was lost (a lost ring or many lost
        lists), up to BATCH rows a pass. A held row ends the look: rows behind it are judged
        once the keys ahead of them are served, where their turn would have come. None: the
        lease is lost."""
        name, priority = queue
        grace = timedelta(seconds=self.grace_s)
        after: tuple[datetime, str] | None = None
        pushed = read = 0
        while read < BATCH:
            page = self.store.oldest_queued_keyed(queue, field, self.grace_s, after, FAIR_PAGE)
            rows = [r for r in page if r.past_grace]
            if not rows:
                break
            read += len(rows)
            heads = key_heads(self.broker, name, priority, {r.key for r in rows}, FAIR_HEAD_IDS)
            at = self.store.queued_at_of([i for ids in heads.values() for i in ids])
            held = {key: _head_at(ids, at) for key, ids in heads.items()}
            lost = lost_rows(rows, inbox_at, held, grace)
            if lost:
                pushes = self.store.restamp_queued_if_leader(lease, lost)
                if pushes is None:
                    return None
                pushed += self._push(pushes)
            if len(lost) < len(rows) or len(rows) < FAIR_PAGE:
                break
            after = (rows[-1].queued_at, rows[-1].id)
        return pushed

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


def lost_rows(
    rows: Iterable[KeyedQueued],
    inbox_at: datetime | None,
    held: Mapping[str, datetime | None],
    grace: timedelta,
) -> list[str]:
    """The ids of a fair queue's rows (past the grace) that no list can hold: each list is in
    queue order, so a row queued earlier than a list's head by more than the grace is not in
    it. `inbox_at`: the queued_at of the inbox's head (None: empty); `held`: key -> the
    queued_at of its list's head, for the keys whose list a pop can reach (None: its head
    holds only ids no longer queued, judged at a later pass); a key left out holds nothing."""
    lost: list[str] = []
    for row in rows:
        if inbox_at is not None and row.queued_at >= inbox_at - grace:
            continue  # maybe still in the inbox, not yet sorted
        if row.key in held:
            head_at = held[row.key]
            if head_at is None or row.queued_at >= head_at - grace:
                continue
        lost.append(row.id)
    return lost


def _head_at(ids: list[str], queued_at: Mapping[str, datetime]) -> datetime | None:
    """When a list's first id still queued was queued (None: none of these is queued)."""
    return next((queued_at[i] for i in ids if i in queued_at), None)
