-- Waiting for a job's end: see migration 0012 for why no wake-up is lost.

-- name: listen_done
LISTEN hivejobs_done;

-- name: watch_job
-- The lock on the live row makes an archiving delete wait until this row is committed. No
-- live row (finished already, or no such job): nothing is inserted; the caller reads the job.
WITH live AS (SELECT id FROM hivejobs_job WHERE id = %(id)s FOR KEY SHARE)
INSERT INTO hivejobs_waiter (job_id, waiter)
SELECT id, %(waiter)s FROM live
RETURNING job_id;

-- name: unwatch_job
-- Also the rows of waiters that died a day ago or more (they never removed their own).
DELETE FROM hivejobs_waiter
 WHERE (job_id = %(id)s AND waiter = %(waiter)s) OR since < now() - interval '1 day';
