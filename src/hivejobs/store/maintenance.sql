-- Leader-only upkeep of the job table (store/maintenance.py).

-- name: promote_due
-- The due ids are collected first, as an array (an InitPlan, run once), and the update finds
-- them by primary key: `id IN (subquery)` let the planner turn it round into a hash join over
-- a scan of the whole table when the statistics made the due set look big.
UPDATE hivejobs_job SET state = 'queued', queued_at = now()
 WHERE id = ANY(ARRAY(SELECT id FROM hivejobs_job
                       WHERE state = 'scheduled' AND run_at <= now()
                       ORDER BY run_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED))
RETURNING id, name, priority;

-- name: any_due
-- Whether promote_due has anything to do, read without the lease (Leases.nothing_to_write):
-- the same search of the due index, one row.
SELECT 1 FROM hivejobs_job WHERE state = 'scheduled' AND run_at <= now() ORDER BY run_at LIMIT 1;

-- name: end_waiting_jobs
-- Jobs that can no longer start: past expires_at (expired), or cancelled while a retry waited.
-- One search per index (expiring, cancel_requested): as one OR they could use neither and
-- read the whole table on every pass. The ids are collected first and found by primary key,
-- as in promote_due. An id in both lists is deleted once.
WITH done AS (
    DELETE FROM hivejobs_job
     WHERE id = ANY(ARRAY(SELECT id FROM hivejobs_job
                           WHERE expires_at <= now() AND state IN ('queued', 'scheduled')
                           LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
                    || ARRAY(SELECT id FROM hivejobs_job
                              WHERE cancel_requested AND state IN ('queued', 'scheduled')
                              LIMIT %(limit)s FOR UPDATE SKIP LOCKED))
       AND state IN ('queued', 'scheduled')
    RETURNING *
)
INSERT INTO hivejobs_archive (id, name, state, priority, attempt, attempts, delivery, payload,
                              created_at, run_at, started_at, finished_at, expires_at, error)
SELECT id, name, CASE WHEN cancel_requested THEN 'cancelled' ELSE 'expired' END, priority,
       attempt, attempts, delivery, payload, created_at, run_at, started_at, now(), expires_at,
       error
  FROM done
RETURNING id;

-- name: any_waiting_ended
-- Whether end_waiting_jobs has anything to do (Leases.nothing_to_write): its two searches,
-- one row. Each in its index's order: with LIMIT 1 alone, statistics that say nothing made
-- a sequential scan look cheapest.
(SELECT 1 FROM hivejobs_job WHERE expires_at <= now() AND state IN ('queued', 'scheduled')
  ORDER BY expires_at LIMIT 1)
UNION ALL
(SELECT 1 FROM hivejobs_job WHERE cancel_requested AND state IN ('queued', 'scheduled')
  ORDER BY id LIMIT 1)
LIMIT 1;

-- name: stale_queued
-- Queued more than the grace before `before` (the queued_at of the id at the head of the
-- queue's Redis list; NULL for an empty list: before now): ids Redis lost, re-pushed oldest
-- first (least() ignores a NULL).
-- The oldest are found by walking this queue's part of the queued index one entry at a time
-- (each step LIMIT 1 in index order, which no other plan beats), stopping once `limit` are
-- found or the entries are younger than the grace. As one ORDER BY ... LIMIT, the planner read
-- and sorted every stale row whenever the statistics made them look few. The rows
-- found are updated where the walk found them (by ctid, within this statement's snapshot,
-- which keeps them from being vacuumed away): a row claimed meanwhile is rechecked on its new
-- version, once that claim's one-statement transaction ends, and skipped: it is no longer
-- queued.
WITH RECURSIVE walk AS (
    (SELECT queued_at, id, ctid FROM hivejobs_job
      WHERE state = 'queued' AND name = %(name)s AND priority = %(priority)s
        AND queued_at < least(now(), %(before)s::timestamptz) - %(grace_s)s * interval '1 second'
      ORDER BY queued_at, id LIMIT 1)
    UNION ALL
    SELECT n.queued_at, n.id, n.ctid
      FROM walk w, LATERAL (
          SELECT queued_at, id, ctid FROM hivejobs_job
           WHERE state = 'queued' AND name = %(name)s AND priority = %(priority)s
             AND (queued_at, id) > (w.queued_at, w.id)
             AND queued_at < least(now(), %(before)s::timestamptz) - %(grace_s)s * interval '1 second'
           ORDER BY queued_at, id LIMIT 1) n
)
UPDATE hivejobs_job SET queued_at = now()
 WHERE ctid = ANY(ARRAY(SELECT ctid FROM walk LIMIT %(limit)s))
   AND state = 'queued'
RETURNING id, name, priority;

-- name: queued_page
-- Keyset page over one queue's part of the queued index, oldest first: a full restore never
-- scans the table. (`queued_at IS NOT NULL` is the index's predicate, migration 0004.)
SELECT id, name, priority, queued_at FROM hivejobs_job
 WHERE state = 'queued' AND queued_at IS NOT NULL
   AND name = %(name)s AND priority = %(priority)s
   AND (queued_at, id) > (%(after_at)s, %(after_id)s)
 ORDER BY queued_at, id LIMIT %(limit)s;

-- name: oldest_queued
-- The oldest queued_at of each queue (type, priority) that has queued rows, and whether it is
-- older than the grace: a walk of the queued index, one step (LIMIT 1 in index order) per
-- queue, so it reads an entry or two per queue whatever the backlog (a count reads every row:
-- 7 ms at 20,000 queued under load). Prepared like any statement with parameters: its
-- custom and generic plans are in the plan-stability test (an entry or two per queue).
WITH RECURSIVE q AS (
    (SELECT name, priority, queued_at FROM hivejobs_job
      WHERE state = 'queued' AND queued_at IS NOT NULL
      ORDER BY name, priority, queued_at LIMIT 1)
    UNION ALL
    SELECT n.name, n.priority, n.queued_at
      FROM q, LATERAL (
          SELECT name, priority, queued_at FROM hivejobs_job
           WHERE state = 'queued' AND queued_at IS NOT NULL
             AND (name, priority) > (q.name, q.priority)
           ORDER BY name, priority, queued_at LIMIT 1) n
)
SELECT name, priority, queued_at, queued_at < now() - %(grace_s)s * interval '1 second' AS past_grace
  FROM q;

-- name: queued_at_of
-- When each of these ids (the heads of Redis lists) was queued; ids no longer queued are left
-- out. Found by primary key alone: no partial index predicate is implied by this WHERE clause
-- (with `queued_at IS NOT NULL` the queued index's is, and a plan ANDed the two indexes and
-- read the queue).
SELECT id, queued_at FROM hivejobs_job WHERE id = ANY(%(ids)s::text[]) AND state = 'queued';

-- name: fair_fields
-- The fair types (fair_by, migration 0016) and their payload fields: the reconciler judges
-- their queues key by key.
SELECT name, fair_by FROM hivejobs_job_type WHERE fair_by IS NOT NULL;

-- name: oldest_queued_keyed
-- A fair type's oldest queued ids of one queue after (queued_at, id), each with its key (as
-- fair.sql reads it) and whether it was queued longer ago than the grace: the reconciler reads
-- the lists of these keys alone. A keyset page as queued_page (the grace is a column, not a
-- bound: a bound made the planner guess few rows and sort them).
SELECT id, queued_at, coalesce(convert_from(payload, 'UTF8')::jsonb ->> %(field)s, '') AS key,
       queued_at < now() - %(grace_s)s * interval '1 second' AS past_grace
  FROM hivejobs_job
 WHERE state = 'queued' AND queued_at IS NOT NULL
   AND name = %(name)s AND priority = %(priority)s
   AND (queued_at, id) > (%(after_at)s, %(after_id)s)
 ORDER BY queued_at, id LIMIT %(limit)s;

-- name: restamp_queued
-- Ids the reconciler found in no Redis list, still queued, re-stamped queued now as
-- stale_queued does, for their push. A row parked by its sequence meanwhile (queued_at NULL)
-- stays parked; said so that it does not imply the queued index's predicate (as flow.sql's
-- claim): the primary key stays the only index a plan can use.
UPDATE hivejobs_job SET queued_at = now()
 WHERE id = ANY(%(ids)s::text[]) AND state = 'queued'
   AND (seq_key IS NULL OR queued_at IS NOT NULL)
RETURNING id, name, priority;

-- name: queued_counts
-- A count reads every queued row; `queued_at IS NOT NULL` lets it read just those, through
-- the queued index, when the rest of the table is bigger (migration 0004).
SELECT name, priority, count(*) AS n FROM hivejobs_job
 WHERE state = 'queued' AND queued_at IS NOT NULL
 GROUP BY name, priority;

-- name: running_counts
-- `worker_id IS NOT NULL` is the running index's predicate (migration 0004): the count reads
-- the running rows, not the queue.
SELECT name, count(*) AS n FROM hivejobs_job
 WHERE state = 'running' AND worker_id IS NOT NULL
 GROUP BY name;

-- name: set_gauge
INSERT INTO hivejobs_gauge (name, queue, value) VALUES (%(name)s, %(queue)s, %(value)s)
ON CONFLICT (name, queue) DO UPDATE SET value = EXCLUDED.value, measured_at = now();

-- name: boot_marker_recorded
-- Has a coordinator ever set a boot marker under this prefix (migration 0013)?
SELECT EXISTS (SELECT 1 FROM hivejobs_boot_marker WHERE prefix = %(prefix)s);

-- name: record_boot_marker
INSERT INTO hivejobs_boot_marker (prefix, marker) VALUES (%(prefix)s, %(marker)s)
ON CONFLICT (prefix) DO UPDATE SET marker = EXCLUDED.marker, set_at = now();

-- name: hot_table_size
-- Live rows (counted up to a cap: only "nearly empty" matters) and bytes, indexes included.
SELECT (SELECT count(*) FROM (SELECT 1 FROM hivejobs_job LIMIT %(cap)s) s)::int AS live,
       pg_total_relation_size('hivejobs_job') AS bytes;

-- name: invalid_hot_indexes
-- Leftovers of an interrupted REINDEX CONCURRENTLY (*_ccnew, *_ccold): invalid, unused.
SELECT i.indexrelid::regclass::text FROM pg_index i
 WHERE i.indrelid = 'hivejobs_job'::regclass AND NOT i.indisvalid;

-- name: prune_archive
DELETE FROM hivejobs_archive
 WHERE id IN (SELECT id FROM hivejobs_archive
               WHERE finished_at < now() - %(retention_s)s * interval '1 second'
               LIMIT 10000);

-- name: prune_unique
DELETE FROM hivejobs_unique WHERE until < now();

-- name: advance_scheduled_if_testing
-- hivejobs.testing.drain(promote=...): jobs waiting in `scheduled` become due now, either
-- every one or only retries waiting out their backoff (attempt > 0; a delayed enqueue has
-- run no attempt yet). promote_due then queues them. Never called by a worker.
UPDATE hivejobs_job SET run_at = now()
 WHERE state = 'scheduled' AND run_at > now() AND (%(every)s OR attempt > 0)
RETURNING id;

-- name: drop_invalid_index
-- The index is a name invalid_hot_indexes returned (regclass text, quoted as needed).
DROP INDEX CONCURRENTLY IF EXISTS {index};

-- name: vacuum_hot_table
VACUUM hivejobs_job;

-- name: reindex_hot_table
REINDEX TABLE CONCURRENTLY hivejobs_job;
