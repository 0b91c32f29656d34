-- Flow control: pause and fleet-wide limits of a job type. The type's flow row is
-- the lock that makes a limited claim atomic; the running slots are its `running` rows.

-- name: ensure_flow
-- A limited type's row exists before its first claim locks it.
INSERT INTO hivejobs_flow (name) VALUES (%(name)s) ON CONFLICT (name) DO NOTHING;

-- name: flow_room
-- What the fetcher may claim, read without a lock before it pops (a hint: flow_lock decides).
-- `worker_id IS NOT NULL` is the running index's predicate: a job awaiting its status
-- callback holds no worker, runs no handler and takes no slot. The running rows are counted
-- only for a cap on them (counts_running): the subquery in the CASE branch not taken is
-- never executed, so a rate alone costs a primary-key lookup.
SELECT f.paused, f.concurrency, f.tokens,
       greatest(extract(epoch FROM clock_timestamp() - f.refilled_at), 0)::float8 AS since_s,
       CASE WHEN %(counts_running)s::boolean
            THEN (SELECT count(*) FROM hivejobs_job j
                   WHERE j.name = %(name)s AND j.state = 'running'
                     AND j.worker_id IS NOT NULL)::int
            ELSE 0 END AS running
  FROM hivejobs_flow f WHERE f.name = %(name)s;

-- name: flow_lock
-- First statement of a limited claim: claims of this type wait here for each other, across
-- the fleet, until the holder commits. Only the statements after it count the running rows
-- (if any limit needs them): their snapshots are taken after the wait, so they see every claim
-- committed before ours.
SELECT paused, tokens, clock_timestamp() AS now,
       greatest(extract(epoch FROM clock_timestamp() - refilled_at), 0)::float8 AS since_s
  FROM hivejobs_flow WHERE name = %(name)s
   FOR UPDATE;

-- name: flow_running
-- Under flow_lock, only for a cap on the type's running jobs (a rate alone needs no count).
SELECT count(*)::int FROM hivejobs_job
 WHERE name = %(name)s AND state = 'running' AND worker_id IS NOT NULL;

-- name: flow_partitions
-- limit_by, under flow_lock: the partition of each popped id still queued for this type. The
-- partition is the field's JSON text ('"acme"', '42', 'null'), so 42 and "42" differ; a
-- payload without the field (stored by a client that did not know the limit) is the ''
-- partition. Primary-key lookups only.
SELECT id,
       coalesce((convert_from(payload, 'UTF8')::jsonb -> %(field)s)::text, '') AS part
  FROM hivejobs_job
 WHERE id = ANY(%(ids)s) AND state = 'queued' AND name = %(name)s;

-- name: flow_running_by_partition
-- limit_by, under flow_lock, in a snapshot taken after it: the slots taken in each partition
-- the claim may take from. Reads the type's running rows through the running index (bounded
-- by the fleet's runner threads of the type), as flow_running does.
SELECT part, count(*)::int
  FROM (SELECT coalesce((convert_from(payload, 'UTF8')::jsonb -> %(field)s)::text, '') AS part
          FROM hivejobs_job
         WHERE name = %(name)s AND state = 'running' AND worker_id IS NOT NULL) r
 WHERE part = ANY(%(parts)s)
 GROUP BY part;

-- name: flow_take_tokens
-- Under flow_lock: the bucket as refilled up to `now` (flow_lock's clock), less what was taken.
UPDATE hivejobs_flow SET tokens = %(tokens)s, refilled_at = %(now)s WHERE name = %(name)s;

-- name: flow_refused
-- Ids a pool popped and did not claim that are still waiting for it (paused, or beyond a
-- limit): they go back to the head of their list. Duplicates of claimed or finished jobs,
-- expired jobs and other types' ids stay dropped, and so do parked ones (queued_at NULL:
-- a sequenced job waiting for its key, dispatched again by the key's hand-over). Written so
-- that it does not imply the queued index's predicate (`queued_at IS NOT NULL`, see
-- queued_at_of in maintenance.sql): the primary key stays the only index it can use.
SELECT id FROM hivejobs_job
 WHERE id = ANY(%(ids)s) AND state = 'queued' AND name = %(name)s
   AND (seq_key IS NULL OR queued_at IS NOT NULL)
   AND (expires_at IS NULL OR expires_at > now());

-- name: pause_type
-- Returns the row when the state changed (a pause of a paused type: no row).
INSERT INTO hivejobs_flow (name, paused, paused_at) VALUES (%(name)s, true, now())
ON CONFLICT (name) DO UPDATE SET paused = true, paused_at = now()
 WHERE NOT hivejobs_flow.paused
RETURNING name;

-- name: resume_type
UPDATE hivejobs_flow SET paused = false, paused_at = NULL WHERE name = %(name)s AND paused
RETURNING name;

-- name: paused_types
SELECT name, paused_at FROM hivejobs_flow WHERE paused ORDER BY name;

-- name: flow_settings
-- What an operator set on a type: pause and `hivejobs scale`. An unlimited type's pools
-- read it every second; `hivejobs serve` shows it. No row: running, the code's concurrency.
SELECT paused, paused_at, concurrency FROM hivejobs_flow WHERE name = %(name)s;

-- name: scale_type
-- NULL: back to the job type's own concurrency.
INSERT INTO hivejobs_flow (name, concurrency) VALUES (%(name)s, %(concurrency)s)
ON CONFLICT (name) DO UPDATE SET concurrency = EXCLUDED.concurrency;

-- name: flow_buckets
-- limit_by with a rate, under flow_lock: the partition buckets a claim may take from, as
-- left by the last claim that took from each (primary-key lookups). A partition without a
-- row has a full bucket.
SELECT part, tokens,
       greatest(extract(epoch FROM %(now)s::timestamptz - refilled_at), 0)::float8 AS since_s
  FROM hivejobs_flow_bucket
 WHERE name = %(name)s AND part = ANY(%(parts)s::text[]);

-- name: flow_take_partition_tokens
-- Under flow_lock: each partition that started jobs keeps its bucket as refilled up to `now`
-- (flow_lock's clock) less what it started, and when it will be full again. An upsert, not an
-- UPDATE: the coordinator may have deleted the row meanwhile (it was full), and an UPDATE of
-- no row would lose the tokens just taken.
INSERT INTO hivejobs_flow_bucket (name, part, tokens, refilled_at, full_at)
SELECT %(name)s, u.part, u.tokens, %(now)s::timestamptz,
       %(now)s::timestamptz + u.refill_s * interval '1 second'
  FROM unnest(%(parts)s::text[], %(tokens)s::float8[], %(refill_s)s::float8[])
       AS u(part, tokens, refill_s)
ON CONFLICT (name, part) DO UPDATE
   SET tokens = EXCLUDED.tokens, refilled_at = EXCLUDED.refilled_at, full_at = EXCLUDED.full_at;

-- name: prune_full_buckets
-- The coordinator's prune: a bucket that has refilled to its burst is the same as no row.
-- No lock needed: a claim that read the row before this delete writes it back whole (its
-- upsert), and a row a claim rewrote meanwhile has a later full_at, which this delete
-- re-checks once the claim commits.
DELETE FROM hivejobs_flow_bucket WHERE full_at <= now();
