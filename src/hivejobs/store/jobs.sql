-- Jobs (store/jobs.py): enqueue, claim, finish, release, cancel, read; job types.
-- Rule numbers (R1..R12) are those of docs/concepts/reliability.md.

-- name: insert_job
-- The run time is computed on the database clock (R5). ON CONFLICT leaves an existing id alone:
-- the caller compares payloads to tell an idempotent retry from a conflict.
WITH v AS (
    SELECT coalesce(%(run_at)s::timestamptz,
                    now() + %(delay_s)s::float8 * interval '1 second',
                    now()) AS run_at
)
INSERT INTO hivejobs_job (id, name, state, priority, attempts, delivery, payload,
                          run_at, queued_at, expires_at, trace_context)
SELECT %(id)s, %(name)s,
       CASE WHEN v.run_at > now() THEN 'scheduled' ELSE 'queued' END,
       %(priority)s, %(attempts)s, %(delivery)s, %(payload)s,
       v.run_at, CASE WHEN v.run_at > now() THEN NULL ELSE now() END, %(expires_at)s,
       %(trace_context)s
  FROM v
ON CONFLICT (id) DO NOTHING
RETURNING id, name, state, priority;

-- name: savepoint_enqueue
-- An enqueue inside the caller's transaction: undone alone if it fails, never committed here.
SAVEPOINT hivejobs_enqueue;

-- name: release_enqueue
RELEASE SAVEPOINT hivejobs_enqueue;

-- name: rollback_to_enqueue
ROLLBACK TO SAVEPOINT hivejobs_enqueue;

-- name: find_existing
-- After a conflicting insert: the job with that id, live or finished.
SELECT name, payload, 'live' AS place FROM hivejobs_job WHERE id = %(id)s
UNION ALL
SELECT name, payload, 'archive' AS place FROM hivejobs_archive WHERE id = %(id)s;

-- name: archived_exists
SELECT name, payload FROM hivejobs_archive WHERE id = %(id)s;

-- name: delete_live
DELETE FROM hivejobs_job WHERE id = %(id)s;

-- name: take_unique_key
-- One job per key while the window lasts. The primary key makes racing enqueuers wait for
-- each other; the loser sees the winner's row (a conflict re-reads the latest version) and
-- takes nothing. Only the row's own columns decide here: a subquery would read the
-- statement's older snapshot, in which the winner's job does not exist yet.
INSERT INTO hivejobs_unique (key, job_id, until)
VALUES (%(key)s, %(id)s, now() + %(window_s)s * interval '1 second')
ON CONFLICT (key) DO UPDATE SET job_id = EXCLUDED.job_id, until = EXCLUDED.until
 WHERE hivejobs_unique.until <= now()
RETURNING job_id;

-- name: unique_owner
-- Read in a new snapshot, after take_unique_key waited for any racing winner to commit.
SELECT u.job_id, coalesce(j.state, a.state) AS state
  FROM hivejobs_unique u
  LEFT JOIN hivejobs_job j ON j.id = u.job_id
  LEFT JOIN hivejobs_archive a ON a.id = u.job_id
 WHERE u.key = %(key)s;

-- name: take_over_unique_key
-- The key's job ended in a state the window does not cover (failed, say): take the key,
-- unless another enqueuer took it first (its job_id is no longer the one we saw).
UPDATE hivejobs_unique SET job_id = %(id)s, until = now() + %(window_s)s * interval '1 second'
 WHERE key = %(key)s AND job_id = %(owner)s
RETURNING job_id;

-- name: claim_queued
-- Claim by primary key: Postgres never scans a queue under contention. Ids no longer queued
-- (claimed, cancelled, archived) are skipped. The attempt is counted here, in the claim (R2).
-- Only the pool's own type: an id pushed into a foreign list never runs under this handler.
-- The primary key is the only index this WHERE clause can use (migration 0004: no partial
-- index predicate is implied by it), so the plan does not depend on the statistics.
UPDATE hivejobs_job
   SET state = 'running', attempt = attempt + 1, worker_id = %(worker_id)s,
       claim_token = nextval('hivejobs_claim_seq'), started_at = now()
 WHERE id = ANY(%(ids)s) AND state = 'queued' AND name = %(name)s
   AND (expires_at IS NULL OR expires_at > now())
   -- Flow control (flow.py): a paused type starts nothing. One lookup by
   -- primary key, run once per statement (it names no column of the job row).
   AND NOT EXISTS (SELECT 1 FROM hivejobs_flow f WHERE f.name = %(name)s AND f.paused)
RETURNING id, name, attempt, attempts, delivery, payload, claim_token, priority, lost,
          extract(epoch FROM now() - run_at)::float8 AS pickup_s, trace_context;

-- name: foreign_ids
-- Ids a pool popped but did not claim that are live jobs of another type.
SELECT id, name FROM hivejobs_job WHERE id = ANY(%(ids)s) AND name <> %(name)s;

-- name: drop_archived_duplicate_if_running
-- A live row whose id is already archived can never be archived itself (the id is finished):
-- the archived record wins, as it does at enqueue (insert_job). Fenced by claim token (R3).
DELETE FROM hivejobs_job j
 WHERE j.id = %(id)s AND j.state = 'running' AND j.claim_token = %(token)s
   AND EXISTS (SELECT 1 FROM hivejobs_archive a WHERE a.id = j.id)
RETURNING j.id;

-- name: archive_finished_if_running
-- Fenced by claim token (R3): a late write from a rescued or timed-out claim changes nothing.
-- Plan stability, the same in every statement that ends claims by id: the ids are
-- also a condition on the table itself (`j.id = ANY(ids)`), so the rows are found by that
-- primary-key lookup, estimated at one row per id whatever the statistics say, and the join
-- with the per-row values is between two sets of batch size: no plan reads the running set
-- or the table (a hash join over a scan would, for a batch that looks big enough).
-- The per-row values come as one JSON array of objects (`rows`, absent keys are NULL,
-- results base64): one parameter for the client to build instead of five arrays, whose
-- element-by-element dumping was the pool's largest cost per completion batch.
-- Each archived row comes back with its sequence key (NULL: not sequenced) and the
-- transaction's now(): the hand-over trigger stamps the key's next job with that queued_at,
-- by which the completer finds the jobs to push (handed_over_at in sequence.sql). A
-- sequenced row also sets hivejobs.hand_over_push for the transaction, so the trigger sends
-- no NOTIFY for what the completer pushes (migration 0023); an unsequenced batch only reads
-- `seq_key IS NULL`.
WITH c AS (
    SELECT * FROM json_to_recordset(%(rows)s::json)
           AS c(id text, token bigint, final_state text, final_error text, final_result text)
), done AS (
    DELETE FROM hivejobs_job j USING c
     WHERE j.id = ANY(%(ids)s::text[])
       AND j.id = c.id AND j.state = 'running' AND j.claim_token = c.token
    RETURNING j.*, c.final_state, c.final_error, decode(c.final_result, 'base64') AS final_result
), kept AS (
    INSERT INTO hivejobs_archive (id, name, state, priority, attempt, attempts, delivery,
                                  payload, created_at, run_at, started_at, finished_at,
                                  expires_at, error, result, claim_token)
    SELECT id, name,
           CASE WHEN cancel_requested AND final_state <> 'succeeded' THEN 'cancelled'
                ELSE final_state END,
           priority, attempt, attempts, delivery, payload, created_at, run_at, started_at,
           now(), expires_at, coalesce(final_error, error), final_result, claim_token
      FROM done
)
SELECT id, name, seq_key, now() AS at FROM done
 WHERE seq_key IS NULL OR set_config('hivejobs.hand_over_push', 'pool', true) = 'pool';

-- name: requeue_if_running
-- Retry (attempt stays counted) or suspension (uncount = 1: a graceful stop is not an
-- attempt, R9). Fenced by claim token. Queued rows come back so the caller pushes their ids.
-- Found by primary key alone, as in archive_finished_if_running.
UPDATE hivejobs_job j
   SET state = CASE WHEN c.delay > 0 THEN 'scheduled' ELSE 'queued' END,
       run_at = now() + c.delay * interval '1 second',
       queued_at = CASE WHEN c.delay > 0 THEN NULL ELSE now() END,
       attempt = j.attempt - c.uncount,
       error = coalesce(c.error, j.error),
       worker_id = NULL, claim_token = NULL
  FROM unnest(%(ids)s::text[], %(tokens)s::bigint[], %(delays)s::float8[],
              %(uncounts)s::int[], %(errors)s::text[]) AS c(id, token, delay, uncount, error)
 WHERE j.id = ANY(%(ids)s::text[])
   AND j.id = c.id AND j.state = 'running' AND j.claim_token = c.token
RETURNING j.id, j.name, j.priority, j.state;

-- name: release_unstarted_if_mine
-- A claim whose COMMIT outcome was unknown: what we may hold never ran, so it goes back
-- without counting the attempt (safe even for at-most-once).
UPDATE hivejobs_job
   SET state = 'queued', attempt = attempt - 1, worker_id = NULL, claim_token = NULL,
       queued_at = now()
 WHERE id = ANY(%(ids)s) AND worker_id = %(worker_id)s AND state = 'running'
RETURNING id, name, priority;

-- name: running_claims
SELECT id, claim_token FROM hivejobs_job WHERE worker_id = %(worker_id)s AND state = 'running';

-- name: release_claims_if_running
-- Claims a live pool no longer tracks (its completion was lost in a Postgres crash under
-- asynchronous commit): back to the queue, the attempt stays counted, like a worker loss.
-- Found by primary key alone, as in archive_finished_if_running. Fenced by the worker too: a
-- callback type's completion ends the claim but keeps its token (worker_id NULL, awaiting the
-- other service), and one written between the pool's read and its check must stay as it is.
UPDATE hivejobs_job j
   SET state = 'queued', queued_at = now(), worker_id = NULL, claim_token = NULL
  FROM unnest(%(ids)s::text[], %(tokens)s::bigint[]) AS c(id, token)
 WHERE j.id = ANY(%(ids)s::text[])
   AND j.id = c.id AND j.state = 'running' AND j.claim_token = c.token
   AND j.worker_id = %(worker_id)s
RETURNING j.id, j.name, j.priority;

-- name: cancel_waiting
WITH done AS (
    DELETE FROM hivejobs_job WHERE id = %(id)s AND state IN ('queued', 'scheduled')
    RETURNING *
)
INSERT INTO hivejobs_archive (id, name, state, priority, attempt, attempts, delivery, payload,
                              created_at, run_at, started_at, finished_at, expires_at, error)
SELECT id, name, 'cancelled', priority, attempt, attempts, delivery, payload, created_at,
       run_at, started_at, now(), expires_at, error
  FROM done
RETURNING id;

-- name: request_cancel_running
UPDATE hivejobs_job SET cancel_requested = true
 WHERE id = %(id)s AND state = 'running'
RETURNING id;

-- name: get_live
SELECT id, name, state, attempt, attempts, priority, delivery, payload, created_at, run_at,
       started_at, NULL::timestamptz AS finished_at, expires_at, error, NULL::bytea AS result
  FROM hivejobs_job WHERE id = %(id)s;

-- name: get_archived
SELECT id, name, state, attempt, attempts, priority, delivery, payload, created_at, run_at,
       started_at, finished_at, expires_at, error, result
  FROM hivejobs_archive WHERE id = %(id)s;

-- name: upsert_job_type
INSERT INTO hivejobs_job_type (name, concurrency, processes, attempts, delivery, timeout_s,
                               callback, callback_timeout_s, sequence_by, on_failure)
VALUES (%(name)s, %(concurrency)s, %(processes)s, %(attempts)s, %(delivery)s, %(timeout_s)s,
        %(callback)s, %(callback_timeout_s)s, %(sequence_by)s, %(on_failure)s)
ON CONFLICT (name) DO UPDATE
   SET concurrency = EXCLUDED.concurrency, processes = EXCLUDED.processes,
       attempts = EXCLUDED.attempts, delivery = EXCLUDED.delivery,
       timeout_s = EXCLUDED.timeout_s, callback = EXCLUDED.callback,
       callback_timeout_s = EXCLUDED.callback_timeout_s, sequence_by = EXCLUDED.sequence_by,
       on_failure = EXCLUDED.on_failure, updated_at = now();

-- name: set_fair_by
-- A type's fair_by (migration 0016), beside upsert_job_type in the same transaction.
UPDATE hivejobs_job_type SET fair_by = %(fair_by)s WHERE name = %(name)s;

-- name: list_job_types
SELECT name, concurrency, processes, attempts, delivery, timeout_s, callback, callback_timeout_s,
       fair_by, sequence_by, on_failure
  FROM hivejobs_job_type ORDER BY name;

-- name: type_counts
WITH live AS (
    SELECT name,
           count(*) FILTER (WHERE state = 'queued') AS queued,
           count(*) FILTER (WHERE state = 'scheduled') AS scheduled,
           count(*) FILTER (WHERE state = 'running') AS running
      FROM hivejobs_job GROUP BY name
), recent AS (
    SELECT name,
           count(*) FILTER (WHERE state = 'failed') AS failed,
           count(*) FILTER (WHERE state = 'succeeded') AS succeeded
      FROM hivejobs_archive WHERE finished_at > now() - interval '1 hour' GROUP BY name
), names AS (
    SELECT name FROM hivejobs_job_type UNION SELECT name FROM live
)
SELECT n.name, coalesce(t.concurrency, 0) AS concurrency, coalesce(t.processes, 0) AS processes,
       coalesce(l.queued, 0) AS queued, coalesce(l.scheduled, 0) AS scheduled,
       coalesce(l.running, 0) AS running, coalesce(r.failed, 0) AS failed_last_hour,
       coalesce(r.succeeded, 0) AS succeeded_last_hour,
       CASE WHEN f.paused THEN f.paused_at END AS paused_at
  FROM names n
  LEFT JOIN hivejobs_job_type t USING (name)
  LEFT JOIN live l USING (name)
  LEFT JOIN recent r USING (name)
  LEFT JOIN hivejobs_flow f USING (name)
 ORDER BY n.name;

-- name: copy_jobs
-- insert_many: fresh jobs (generated ids) in one COPY; columns as in store/jobs.py COPY_TYPES.
COPY hivejobs_job (id, name, state, priority, attempts, delivery, payload, run_at, queued_at,
                   expires_at, trace_context) FROM STDIN (FORMAT BINARY);
