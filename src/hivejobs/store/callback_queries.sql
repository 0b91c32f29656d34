-- Status callbacks (rickover): a callback type's job stays running, without a worker, after its
-- handler returned, until the other service posts the outcome of that attempt.

-- name: await_callback_if_running
-- The handler returned: the claim ends here (worker_id NULL: no rescue, no pool holds it), the
-- job stays running until the callback or its deadline. Fenced by claim token, as every end of
-- a claim; a callback that came first has archived the row, so this changes nothing.
UPDATE hivejobs_job j
   SET worker_id = NULL,
       callback_deadline = now() + c.timeout * interval '1 second'
  FROM unnest(%(ids)s::text[], %(tokens)s::bigint[], %(timeouts)s::float8[])
       AS c(id, token, timeout)
 WHERE j.id = ANY(%(ids)s::text[])
   AND j.id = c.id AND j.state = 'running' AND j.claim_token = c.token
RETURNING j.id;

-- name: callback_archive_if_running
-- The other service's outcome for this attempt: a wrong attempt or another state matches no
-- row (the caller answers 409). A cancel requested meanwhile wins over a failure.
WITH done AS (
    DELETE FROM hivejobs_job
     WHERE id = %(id)s AND name = %(name)s AND state = 'running' AND attempt = %(attempt)s
    RETURNING *
)
INSERT INTO hivejobs_archive (id, name, state, priority, attempt, attempts, delivery, payload,
                              created_at, run_at, started_at, finished_at, expires_at, error,
                              claim_token)
SELECT id, name,
       CASE WHEN cancel_requested AND %(state)s <> 'succeeded' THEN 'cancelled'
            ELSE %(state)s END,
       priority, attempt, attempts, delivery, payload, created_at, run_at, started_at, now(),
       expires_at, %(error)s, claim_token
  FROM done
RETURNING id;

-- name: callback_retry_if_running
-- A failed, retryable callback with attempts left: scheduled after the backoff (the promoter
-- queues it when due); the attempt stays counted.
UPDATE hivejobs_job
   SET state = 'scheduled', run_at = now() + %(delay_s)s * interval '1 second',
       queued_at = NULL, worker_id = NULL, claim_token = NULL, callback_deadline = NULL,
       error = %(error)s
 WHERE id = %(id)s AND name = %(name)s AND state = 'running' AND attempt = %(attempt)s
   AND attempt < attempts AND NOT cancel_requested
RETURNING id;

-- name: callback_job_state
-- Why a callback was refused: the job's state and attempt, live or archived.
SELECT state, attempt, callback_deadline IS NOT NULL AS awaiting
  FROM hivejobs_job WHERE id = %(id)s AND name = %(name)s
UNION ALL
SELECT state, attempt, false FROM hivejobs_archive WHERE id = %(id)s AND name = %(name)s;

-- name: cancel_awaiting_callback
-- A job waiting for its callback has no process to tell: cancel it at once.
WITH done AS (
    DELETE FROM hivejobs_job
     WHERE id = %(id)s AND state = 'running' AND worker_id IS NULL
       AND callback_deadline IS NOT NULL
    RETURNING *
)
INSERT INTO hivejobs_archive (id, name, state, priority, attempt, attempts, delivery, payload,
                              created_at, run_at, started_at, finished_at, expires_at, error,
                              claim_token)
SELECT id, name, 'cancelled', priority, attempt, attempts, delivery, payload, created_at, run_at,
       started_at, now(), expires_at, error, claim_token
  FROM done
RETURNING id;

-- name: any_callback_timed_out
-- Whether the two statements below have anything to do (Leases.nothing_to_write): their
-- search, one row.
SELECT 1 FROM hivejobs_job WHERE callback_deadline < now() AND state = 'running'
 ORDER BY callback_deadline LIMIT 1;

-- name: callback_timeouts_retry
-- Callbacks that never came (deadline passed): retried like a failed attempt, after the
-- default backoff (1 s doubling per attempt, capped at 10 minutes, 20 percent jitter either
-- way), while attempts are left. At-most-once types are failed below, never re-run.
UPDATE hivejobs_job
   SET state = 'scheduled',
       run_at = now() + least(600.0, power(2.0, least(attempt - 1, 30)))
                        * (0.8 + random() * 0.4) * interval '1 second',
       queued_at = NULL, worker_id = NULL, claim_token = NULL, callback_deadline = NULL,
       error = 'callback timed out'
 WHERE id IN (SELECT id FROM hivejobs_job
               WHERE callback_deadline < now() AND state = 'running'
               ORDER BY callback_deadline LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
   AND delivery = 'at_least_once' AND attempt < attempts AND NOT cancel_requested
RETURNING id, name;

-- name: callback_timeouts_fail
WITH done AS (
    DELETE FROM hivejobs_job
     WHERE id IN (SELECT id FROM hivejobs_job
                   WHERE callback_deadline < now() AND state = 'running'
                   ORDER BY callback_deadline LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
    RETURNING *
)
INSERT INTO hivejobs_archive (id, name, state, priority, attempt, attempts, delivery, payload,
                              created_at, run_at, started_at, finished_at, expires_at, error,
                              claim_token)
SELECT id, name, CASE WHEN cancel_requested THEN 'cancelled' ELSE 'failed' END, priority,
       attempt, attempts, delivery, payload, created_at, run_at, started_at, now(), expires_at,
       'callback timed out', claim_token
  FROM done
RETURNING id, name;
