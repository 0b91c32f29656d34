-- Worker processes (store/workers.py): registration, heartbeats, rescue of dead ones' claims.
-- Rule numbers (R1..R12) are those of docs/concepts/reliability.md.

-- name: register_worker
INSERT INTO hivejobs_worker (id, host, pid, role, pool) VALUES (%(id)s, %(host)s, %(pid)s,
       %(role)s, %(pool)s);

-- name: heartbeat
-- No row back means the coordinator declared this process dead: it must stop.
UPDATE hivejobs_worker SET heartbeat_at = now() WHERE id = %(id)s RETURNING id;

-- name: heartbeat_all
-- The worker rows of one process (a shared pool runs one per job type), on one clock read.
-- Fewer rows back than ids means the coordinator declared the process dead: it must stop.
UPDATE hivejobs_worker SET heartbeat_at = now() WHERE id = ANY(%(ids)s::uuid[]) RETURNING id;

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

-- name: delete_workers
DELETE FROM hivejobs_worker WHERE id = ANY(%(worker_ids)s::uuid[]);

-- name: running_of_workers
-- What a stopping supervisor waits for: its pools' running jobs, longest-running first.
SELECT id, name FROM hivejobs_job
 WHERE worker_id = ANY(%(worker_ids)s::uuid[]) AND state = 'running'
 ORDER BY started_at, id LIMIT 100;
