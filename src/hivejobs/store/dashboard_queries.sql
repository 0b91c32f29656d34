-- The dashboard's and the HTTP API's reads. Every page is a keyset page over an index: no
-- OFFSET, and no count(*) over the archive (counts come from the small hot table alone). One
-- exception, bounded by one chain's size: chain_log_page numbers the pages of a chain's log.

-- name: live_counts
-- The hot table holds live jobs only, so this stays cheap however big the archive grows.
SELECT name, state, count(*)::int AS n FROM hivejobs_job GROUP BY name, state;

-- name: queued_jobs
-- Oldest first over hivejobs_job_queued (queued_at, id).
SELECT id, name, state, attempt, attempts, priority, created_at, run_at, started_at,
       NULL::timestamptz AS finished_at, left(error, 300) AS error,
       right(error, 4000) AS error_tail, expires_at, queued_at AS at
  FROM hivejobs_job
 WHERE state = 'queued' AND queued_at IS NOT NULL AND (%(name)s::text IS NULL OR name = %(name)s)
   AND (queued_at, id) > (%(after_at)s, %(after_id)s)
 ORDER BY queued_at, id LIMIT %(limit)s;

-- name: scheduled_jobs
-- Soonest first over hivejobs_job_due (run_at).
SELECT id, name, state, attempt, attempts, priority, created_at, run_at, started_at,
       NULL::timestamptz AS finished_at, left(error, 300) AS error,
       right(error, 4000) AS error_tail, expires_at, run_at AS at
  FROM hivejobs_job
 WHERE state = 'scheduled' AND (%(name)s::text IS NULL OR name = %(name)s)
   AND run_at >= %(after_at)s AND (run_at, id) > (%(after_at)s, %(after_id)s)
 ORDER BY run_at, id LIMIT %(limit)s;

-- name: running_jobs
-- The running set is bounded by the fleet's concurrency (plus jobs awaiting a callback).
SELECT id, name, state, attempt, attempts, priority, created_at, run_at, started_at,
       NULL::timestamptz AS finished_at, left(error, 300) AS error,
       right(error, 4000) AS error_tail, expires_at, started_at AS at
  FROM hivejobs_job
 WHERE state = 'running' AND (%(name)s::text IS NULL OR name = %(name)s)
   AND (started_at, id) > (%(after_at)s, %(after_id)s)
 ORDER BY started_at, id LIMIT %(limit)s;

-- name: failed_jobs
-- Newest first over hivejobs_archive_failed (finished_at, id) WHERE state = 'failed'.
SELECT id, name, state, attempt, attempts, priority, created_at, run_at, started_at,
       finished_at, left(error, 300) AS error, right(error, 4000) AS error_tail,
       expires_at, finished_at AS at
  FROM hivejobs_archive
 WHERE state = 'failed' AND (%(name)s::text IS NULL OR name = %(name)s)
   AND (finished_at, id) < (%(after_at)s, %(after_id)s)
 ORDER BY finished_at DESC, id DESC LIMIT %(limit)s;

-- name: finished_jobs
-- Newest first over hivejobs_archive_finished (finished_at): the first condition bounds the
-- backward index scan, the row comparison breaks ties by id.
SELECT id, name, state, attempt, attempts, priority, created_at, run_at, started_at,
       finished_at, left(error, 300) AS error, right(error, 4000) AS error_tail,
       expires_at, finished_at AS at
  FROM hivejobs_archive
 WHERE finished_at <= %(after_at)s AND (%(name)s::text IS NULL OR name = %(name)s)
   AND (finished_at, id) < (%(after_at)s, %(after_id)s)
 ORDER BY finished_at DESC, id DESC LIMIT %(limit)s;

-- name: chains_page
-- Newest first over hivejobs_chain_created (created_at).
SELECT c.id, c.name, c.state, c.jobs,
       (SELECT count(*) FROM hivejobs_chain_job j
         WHERE j.chain_id = c.id AND j.state = 'succeeded')::int AS succeeded,
       c.created_at, c.finished_at, c.created_at AS sort_at
  FROM hivejobs_chain c
 WHERE c.created_at <= %(after_at)s AND (c.created_at, c.id) < (%(after_at)s, %(after_id)s)
 ORDER BY c.created_at DESC, c.id DESC LIMIT %(limit)s;

-- name: leader
SELECT holder::text, term, acquired_at, expires_at, expires_at > now() AS valid,
       extract(epoch FROM expires_at - now())::float8 AS expires_in_s
  FROM hivejobs_leader WHERE name = 'coordinator';

-- name: chain_log_page
-- The chain page's job log, a page at a time and without the captured output (the job's own
-- page shows that): a chain of 20,000 tries is not one response.
-- A long error keeps its tail: a traceback ends with the exception and its message.
SELECT key, try AS try_, state, finished_at,
       CASE WHEN length(error) > %(error_chars)s THEN '...' || right(error, %(error_chars)s)
            ELSE error END AS error,
       count(*) OVER () AS total
  FROM hivejobs_job_log
 WHERE chain_id = %(id)s
 ORDER BY finished_at, key, try
 LIMIT %(limit)s OFFSET %(offset)s;
