-- Batches (store/batches.py); the counting trigger and the callback decision are in
-- migrations/0018_batches.sql, where they run in the transactions that end jobs.

-- name: create_batch
INSERT INTO hivejobs_batch (id, on_complete, complete_attempts, complete_delivery,
                            on_success, success_attempts, success_delivery, priority, data)
VALUES (%(id)s, %(on_complete)s, %(complete_attempts)s, %(complete_delivery)s,
        %(on_success)s, %(success_attempts)s, %(success_delivery)s, %(priority)s, %(data)s)
RETURNING id;

-- name: lock_batch_for_add
-- Taken after the jobs are stored, held until the adding transaction ends: the counters it
-- raises and the jobs commit together, checked against the batch's state as it is then.
-- FOR NO KEY UPDATE: the same lock the counting trigger's UPDATE takes.
SELECT sealed, completed_at IS NOT NULL AS completed,
       EXISTS (SELECT 1 FROM hivejobs_batch_job m
                WHERE m.job_id = %(adder)s AND m.batch_id = b.id) AS adder_live
  FROM hivejobs_batch b
 WHERE id = %(id)s
   FOR NO KEY UPDATE;

-- name: add_members
-- New jobs only (the caller stored them in this transaction), so no id is a member yet.
WITH m AS (
    INSERT INTO hivejobs_batch_job (job_id, batch_id)
    SELECT unnest(%(ids)s::text[]), %(id)s
    RETURNING 1
)
UPDATE hivejobs_batch
   SET total = total + (SELECT count(*) FROM m), pending = pending + (SELECT count(*) FROM m)
 WHERE id = %(id)s
RETURNING total;

-- name: seal_batch
UPDATE hivejobs_batch SET sealed = true, sealed_at = now()
 WHERE id = %(id)s AND NOT sealed
RETURNING id;

-- name: finish_batch_if_done
-- A sealed batch whose jobs all ended already (or that has none) completes at its seal.
SELECT hivejobs_batch_finish_if_done(%(id)s);

-- name: batch_exists
SELECT sealed FROM hivejobs_batch WHERE id = %(id)s;

-- name: get_batch
SELECT id, on_complete, on_success, priority, data, sealed, total, pending, succeeded, failed,
       cancelled, expired, created_at, sealed_at, completed_at, complete_job_id, success_job_id
  FROM hivejobs_batch
 WHERE id = %(id)s;

-- name: failed_members
-- The members that ended other than succeeded, by id (the page a status shows).
SELECT job_id, name, state FROM hivejobs_batch_failed
 WHERE batch_id = %(id)s
 ORDER BY job_id
 LIMIT %(limit)s;

-- name: batch_of_job
-- A live member's batch (JobContext.batch); a job that ended is no member any more.
SELECT batch_id FROM hivejobs_batch_job WHERE job_id = %(id)s;

-- name: recent_batches
SELECT id, on_complete, on_success, priority, data, sealed, total, pending, succeeded, failed,
       cancelled, expired, created_at, sealed_at, completed_at, complete_job_id, success_job_id
  FROM hivejobs_batch
 ORDER BY created_at DESC, id DESC
 LIMIT %(limit)s;

-- name: prune_completed_batches
-- Batches complete for longer than the archive's retention, with their failed-member rows
-- (found through the failed table's primary key). Open and sealed batches are never pruned.
WITH gone AS (
    DELETE FROM hivejobs_batch
     WHERE id IN (SELECT id FROM hivejobs_batch
                   WHERE completed_at < now() - %(retention_s)s::float8 * interval '1 second'
                   ORDER BY completed_at LIMIT %(limit)s)
    RETURNING id
), failed AS (
    DELETE FROM hivejobs_batch_failed f USING gone WHERE f.batch_id = gone.id
)
SELECT count(*) FROM gone;
