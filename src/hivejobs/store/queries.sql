-- name: insert_job
-- The run time is computed on the database clock (R5). ON CONFLICT leaves an existing id alone:
-- the caller compares payloads to tell an idempotent retry from a conflict.
WITH v AS (
    SELECT coalesce(%(run_at)s::timestamptz,
                    now() + %(delay_s)s::float8 * interval '1 second',
                    now()) AS run_at
)
INSERT INTO hivejobs_job (id, name, state, priority, attempts, delivery, payload,
                          run_at, queued_at, expires_at)
SELECT %(id)s, %(name)s,
       CASE WHEN v.run_at > now() THEN 'scheduled' ELSE 'queued' END,
       %(priority)s, %(attempts)s, %(delivery)s, %(payload)s,
       v.run_at, CASE WHEN v.run_at > now() THEN NULL ELSE now() END, %(expires_at)s
  FROM v
ON CONFLICT (id) DO NOTHING
RETURNING id, name, state, priority;

-- name: notify_dispatch
-- Jobs enqueued in the caller's transaction: the coordinator pushes their ids once (and only
-- if) that transaction commits, because NOTIFY is delivered on commit. Payloads are built by
-- store/enqueue.py (dispatch_payloads), which also parses them.
SELECT pg_notify('hivejobs_dispatch', p) FROM unnest(%(payloads)s::text[]) AS p;

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
   -- Flow control hook (issue 12, flow.py): a paused type starts nothing. One lookup by
   -- primary key, run once per statement (it names no column of the job row).
   AND NOT EXISTS (SELECT 1 FROM hivejobs_flow f WHERE f.name = %(name)s AND f.paused)
RETURNING id, name, attempt, attempts, delivery, payload, claim_token, priority, lost,
          extract(epoch FROM now() - run_at)::float8 AS pickup_s;

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
-- Plan stability (issue 21), the same in every statement that ends claims by id: the ids are
-- also a condition on the table itself (`j.id = ANY(ids)`), so the rows are found by that
-- primary-key lookup, estimated at one row per id whatever the statistics say, and the join
-- with the per-row values is between two sets of batch size: no plan reads the running set
-- or the table (a hash join over a scan would, for a batch that looks big enough).
WITH c AS (
    SELECT * FROM unnest(%(ids)s::text[], %(tokens)s::bigint[], %(states)s::text[],
                         %(errors)s::text[], %(results)s::bytea[])
           AS c(id, token, final_state, final_error, final_result)
), done AS (
    DELETE FROM hivejobs_job j USING c
     WHERE j.id = ANY(%(ids)s::text[])
       AND j.id = c.id AND j.state = 'running' AND j.claim_token = c.token
    RETURNING j.*, c.final_state, c.final_error, c.final_result
)
INSERT INTO hivejobs_archive (id, name, state, priority, attempt, attempts, delivery, payload,
                              created_at, run_at, started_at, finished_at, expires_at, error,
                              result, claim_token)
SELECT id, name,
       CASE WHEN cancel_requested AND final_state <> 'succeeded' THEN 'cancelled'
            ELSE final_state END,
       priority, attempt, attempts, delivery, payload, created_at, run_at, started_at, now(),
       expires_at, coalesce(final_error, error), final_result, claim_token
  FROM done
RETURNING id;

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
-- Found by primary key alone, as in archive_finished_if_running.
UPDATE hivejobs_job j
   SET state = 'queued', queued_at = now(), worker_id = NULL, claim_token = NULL
  FROM unnest(%(ids)s::text[], %(tokens)s::bigint[]) AS c(id, token)
 WHERE j.id = ANY(%(ids)s::text[])
   AND j.id = c.id AND j.state = 'running' AND j.claim_token = c.token
RETURNING j.id, j.name, j.priority;

-- name: rescue_drop_archived_duplicates
-- Claims of dead processes whose id is already archived: the archived record wins (see
-- drop_archived_duplicate_if_running); the archive insert below would fail on them.
DELETE FROM hivejobs_job j
 WHERE j.worker_id = ANY(%(worker_ids)s::uuid[]) AND j.state = 'running'
   AND EXISTS (SELECT 1 FROM hivejobs_archive a WHERE a.id = j.id)
RETURNING j.id;

-- name: rescue_requeue
-- Claims of dead processes: at-least-once jobs with attempts left and under the poison-pill
-- limit go back to the queue with the attempt counted (R2); the rest are failed below.
UPDATE hivejobs_job
   SET state = 'queued', queued_at = now(), lost = lost + 1, worker_id = NULL,
       claim_token = NULL, error = 'worker lost'
 WHERE worker_id = ANY(%(worker_ids)s::uuid[]) AND state = 'running'
   AND delivery = 'at_least_once' AND attempt < attempts AND lost + 1 < %(poison_after)s
   AND NOT cancel_requested
RETURNING id, name, priority;

-- name: rescue_fail
-- At-most-once and maybe started: fail it, never requeue.
WITH done AS (
    DELETE FROM hivejobs_job
     WHERE worker_id = ANY(%(worker_ids)s::uuid[]) AND state = 'running'
    RETURNING *
)
INSERT INTO hivejobs_archive (id, name, state, priority, attempt, attempts, delivery, payload,
                              created_at, run_at, started_at, finished_at, expires_at, error,
                              claim_token)
SELECT id, name, CASE WHEN cancel_requested THEN 'cancelled' ELSE 'failed' END,
       priority, attempt, attempts, delivery, payload, created_at, run_at, started_at, now(),
       expires_at,
       CASE WHEN delivery = 'at_least_once' AND lost + 1 >= %(poison_after)s
            THEN 'worker lost (poison pill: its process died ' || (lost + 1) || ' times)'
            ELSE 'worker lost' END,
       claim_token
  FROM done
RETURNING id;

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
                               callback, callback_timeout_s)
VALUES (%(name)s, %(concurrency)s, %(processes)s, %(attempts)s, %(delivery)s, %(timeout_s)s,
        %(callback)s, %(callback_timeout_s)s)
ON CONFLICT (name) DO UPDATE
   SET concurrency = EXCLUDED.concurrency, processes = EXCLUDED.processes,
       attempts = EXCLUDED.attempts, delivery = EXCLUDED.delivery,
       timeout_s = EXCLUDED.timeout_s, callback = EXCLUDED.callback,
       callback_timeout_s = EXCLUDED.callback_timeout_s, updated_at = now();

-- name: list_job_types
SELECT name, concurrency, processes, attempts, delivery, timeout_s, callback, callback_timeout_s
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
       coalesce(r.succeeded, 0) AS succeeded_last_hour
  FROM names n
  LEFT JOIN hivejobs_job_type t USING (name)
  LEFT JOIN live l USING (name)
  LEFT JOIN recent r USING (name)
 ORDER BY n.name;

-- name: register_worker
INSERT INTO hivejobs_worker (id, host, pid, role, pool) VALUES (%(id)s, %(host)s, %(pid)s,
       %(role)s, %(pool)s);

-- name: heartbeat
-- No row back means the coordinator declared this process dead: it must stop.
UPDATE hivejobs_worker SET heartbeat_at = now() WHERE id = %(id)s RETURNING id;

-- name: deregister_worker
DELETE FROM hivejobs_worker WHERE id = %(id)s;

-- name: list_workers
SELECT w.id::text AS id, w.host, w.pid, w.role, w.pool, w.started_at, w.heartbeat_at,
       extract(epoch FROM now() - w.heartbeat_at)::float8 AS heartbeat_age_s,
       (SELECT count(*) FROM hivejobs_job j
         WHERE j.worker_id = w.id AND j.state = 'running')::int AS running
  FROM hivejobs_worker w ORDER BY w.role, w.pool, w.started_at;

-- name: find_dead_workers
-- Heartbeats judged on the database clock (R5). A running job whose worker row is missing is
-- orphaned too (R4). Its holders are found by skipping from one worker_id to the next in the
-- running index (each step one descent, LIMIT 1 in index order), so a pass costs a few
-- buffers per worker holding claims instead of a read of the whole running set every second.
-- A job awaiting its status callback runs with no worker (worker_id NULL): nobody to
-- rescue it from; its callback deadline ends it instead.
WITH RECURSIVE holders AS (
    (SELECT worker_id FROM hivejobs_job
      WHERE state = 'running' AND worker_id IS NOT NULL
      ORDER BY worker_id LIMIT 1)
    UNION ALL
    SELECT (SELECT j.worker_id FROM hivejobs_job j
             WHERE j.state = 'running' AND j.worker_id > h.worker_id
             ORDER BY j.worker_id LIMIT 1)
      FROM holders h
     WHERE h.worker_id IS NOT NULL
)
SELECT id::text FROM hivejobs_worker WHERE heartbeat_at < now() - %(stuck_after_s)s * interval '1 second'
UNION
SELECT h.worker_id::text FROM holders h
 WHERE h.worker_id IS NOT NULL
   AND NOT EXISTS (SELECT 1 FROM hivejobs_worker w WHERE w.id = h.worker_id);

-- name: delete_workers
DELETE FROM hivejobs_worker WHERE id = ANY(%(worker_ids)s::uuid[]);

-- name: queued_page
-- Keyset page over one queue's part of the queued index, oldest first: a full restore never
-- scans the table. (`queued_at IS NOT NULL` is the index's predicate, migration 0004.)
SELECT id, name, priority, queued_at FROM hivejobs_job
 WHERE state = 'queued' AND queued_at IS NOT NULL
   AND name = %(name)s AND priority = %(priority)s
   AND (queued_at, id) > (%(after_at)s, %(after_id)s)
 ORDER BY queued_at, id LIMIT %(limit)s;

-- name: queued_counts
-- A count reads every queued row; `queued_at IS NOT NULL` lets it read just those, through
-- the queued index, when the rest of the table is bigger (migration 0004).
SELECT name, priority, count(*) AS n FROM hivejobs_job
 WHERE state = 'queued' AND queued_at IS NOT NULL
 GROUP BY name, priority;

-- name: lease_acquire
-- Take the lease when free or expired, renew it when ours; the term grows on every change of
-- holder, and every coordinator write checks it (R7).
INSERT INTO hivejobs_leader (name, holder, term, acquired_at, expires_at)
VALUES ('coordinator', %(holder)s, 1, now(), now() + %(ttl_s)s * interval '1 second')
ON CONFLICT (name) DO UPDATE
   SET holder = EXCLUDED.holder,
       term = CASE WHEN hivejobs_leader.holder = EXCLUDED.holder THEN hivejobs_leader.term
                   ELSE hivejobs_leader.term + 1 END,
       acquired_at = CASE WHEN hivejobs_leader.holder = EXCLUDED.holder
                          THEN hivejobs_leader.acquired_at ELSE now() END,
       expires_at = EXCLUDED.expires_at
 WHERE hivejobs_leader.holder = EXCLUDED.holder
    OR hivejobs_leader.holder IS NULL
    OR hivejobs_leader.expires_at < now()
RETURNING term;

-- name: lease_resign
UPDATE hivejobs_leader SET holder = NULL, expires_at = now()
 WHERE name = 'coordinator' AND holder = %(holder)s;

-- name: lease_read
SELECT holder::text, term, expires_at > now() AS valid FROM hivejobs_leader
 WHERE name = 'coordinator';

-- name: lease_hold
-- First statement of every coordinator transaction: FOR SHARE makes a takeover wait until this
-- transaction ends, so no write of an old term lands after a new term began (I7).
SELECT term FROM hivejobs_leader
 WHERE name = 'coordinator' AND holder = %(holder)s AND term = %(term)s AND expires_at > now()
   FOR SHARE;

-- name: promote_due
-- The due ids are collected first, as an array (an InitPlan, run once), and the update finds
-- them by primary key: `id IN (subquery)` let the planner turn it round into a hash join over
-- a scan of the whole table when the statistics made the due set look big (issue 21).
UPDATE hivejobs_job SET state = 'queued', queued_at = now()
 WHERE id = ANY(ARRAY(SELECT id FROM hivejobs_job
                       WHERE state = 'scheduled' AND run_at <= now()
                       ORDER BY run_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED))
RETURNING id, name, priority;

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

-- name: stale_queued
-- Queued longer than the grace: re-pushed oldest first when Redis holds fewer ids than Postgres.
-- The oldest are found by walking this queue's part of the queued index one entry at a time
-- (each step LIMIT 1 in index order, which no other plan beats), stopping once `limit` are
-- found or the entries are younger than the grace. As one ORDER BY ... LIMIT, the planner read
-- and sorted every stale row whenever the statistics made them look few (issue 21). The rows
-- found are updated where the walk found them (by ctid, within this statement's snapshot,
-- which keeps them from being vacuumed away): a row claimed meanwhile is rechecked on its new
-- version, once that claim's one-statement transaction ends, and skipped: it is no longer
-- queued.
WITH RECURSIVE walk AS (
    (SELECT queued_at, id, ctid FROM hivejobs_job
      WHERE state = 'queued' AND name = %(name)s AND priority = %(priority)s
        AND queued_at < now() - %(grace_s)s * interval '1 second'
      ORDER BY queued_at, id LIMIT 1)
    UNION ALL
    SELECT n.queued_at, n.id, n.ctid
      FROM walk w, LATERAL (
          SELECT queued_at, id, ctid FROM hivejobs_job
           WHERE state = 'queued' AND name = %(name)s AND priority = %(priority)s
             AND (queued_at, id) > (w.queued_at, w.id)
             AND queued_at < now() - %(grace_s)s * interval '1 second'
           ORDER BY queued_at, id LIMIT 1) n
)
UPDATE hivejobs_job SET queued_at = now()
 WHERE ctid = ANY(ARRAY(SELECT ctid FROM walk LIMIT %(limit)s))
   AND state = 'queued'
RETURNING id, name, priority;

-- name: prune_archive
DELETE FROM hivejobs_archive
 WHERE id IN (SELECT id FROM hivejobs_archive
               WHERE finished_at < now() - %(retention_s)s * interval '1 second'
               LIMIT 10000);

-- name: set_gauge
INSERT INTO hivejobs_gauge (name, queue, value) VALUES (%(name)s, %(queue)s, %(value)s)
ON CONFLICT (name, queue) DO UPDATE SET value = EXCLUDED.value, measured_at = now();

-- name: running_counts
-- `worker_id IS NOT NULL` is the running index's predicate (migration 0004): the count reads
-- the running rows, not the queue.
SELECT name, count(*) AS n FROM hivejobs_job
 WHERE state = 'running' AND worker_id IS NOT NULL
 GROUP BY name;

-- name: hot_table_size
-- Live rows (counted up to a cap: only "nearly empty" matters) and bytes, indexes included.
SELECT (SELECT count(*) FROM (SELECT 1 FROM hivejobs_job LIMIT %(cap)s) s)::int AS live,
       pg_total_relation_size('hivejobs_job') AS bytes;

-- name: invalid_hot_indexes
-- Leftovers of an interrupted REINDEX CONCURRENTLY (*_ccnew, *_ccold): invalid, unused.
SELECT i.indexrelid::regclass::text FROM pg_index i
 WHERE i.indrelid = 'hivejobs_job'::regclass AND NOT i.indisvalid;

-- name: db_now
-- The database clock, which every time in the schema is judged on.
SELECT now();

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

-- name: prune_unique
DELETE FROM hivejobs_unique WHERE until < now();

-- name: advance_scheduled_if_testing
-- hivejobs.testing.drain(promote=...): jobs waiting in `scheduled` become due now, either
-- every one or only retries waiting out their backoff (attempt > 0; a delayed enqueue has
-- run no attempt yet). promote_due then queues them. Never called by a worker.
UPDATE hivejobs_job SET run_at = now()
 WHERE state = 'scheduled' AND run_at > now() AND (%(every)s OR attempt > 0)
RETURNING id;

-- name: running_of_workers
-- What a stopping supervisor waits for: its pools' running jobs, longest-running first.
SELECT id, name FROM hivejobs_job
 WHERE worker_id = ANY(%(worker_ids)s::uuid[]) AND state = 'running'
 ORDER BY started_at, id LIMIT 100;
