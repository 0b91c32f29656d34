-- The last progress of each job (migration 0020): written by the pools, read by streams.

-- name: save_progress
-- One statement for every job whose progress is due. An older attempt never overwrites a
-- newer one's row (a rescued attempt's pool may still be writing).
INSERT INTO hivejobs_progress AS p (job_id, attempt, done, total, note, updated_at)
SELECT u.job_id, u.attempt, u.done, u.total, u.note, now()
  FROM unnest(%(job_ids)s::text[], %(attempts)s::int[], %(dones)s::float8[],
              %(totals)s::float8[], %(notes)s::text[]) AS u(job_id, attempt, done, total, note)
ON CONFLICT (job_id) DO UPDATE
   SET attempt = excluded.attempt, done = excluded.done, total = excluded.total,
       note = excluded.note, updated_at = excluded.updated_at
 WHERE p.attempt <= excluded.attempt;

-- name: get_progress
SELECT job_id, attempt, done, total, note, updated_at
  FROM hivejobs_progress
 WHERE job_id = %(id)s;

-- name: prune_progress
-- Rows older than the retention whose job is not live: its archive row (if any) goes with
-- the same retention, and a live job's row is still its latest progress.
DELETE FROM hivejobs_progress p
 WHERE p.updated_at < now() - %(retention_s)s::float8 * interval '1 second'
   AND NOT EXISTS (SELECT 1 FROM hivejobs_job j WHERE j.id = p.job_id);
