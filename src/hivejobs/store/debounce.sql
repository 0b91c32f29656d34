-- Debounce and coalesce keys (store/debounce.py, hivejobs/debounce.py).

-- name: lock_debounce_key
-- Create the key's row or lock the one there: DO UPDATE, not DO NOTHING, so that a conflict
-- locks the row too (after waiting for a racing enqueuer's transaction to end), and RETURNING
-- gives its latest committed version. `job_id = id` tells that this call created it.
INSERT INTO hivejobs_debounce (key, job_id, first_at)
VALUES (%(key)s, %(id)s, now())
ON CONFLICT (key) DO UPDATE SET key = EXCLUDED.key
RETURNING job_id, first_at;

-- name: debounce_into_waiting
-- The key's job, if it has not started, becomes this enqueue (the last one wins: payload,
-- priority, expiry) and its run moves to now + within, never past first_at + max_wait
-- (least() ignores a NULL max_wait). A queued job may go back to scheduled: its id already
-- in Redis is then skipped by the claim (state guard) and pushed again when due. Read in a
-- new snapshot, after lock_debounce_key waited for the previous holder of the key.
-- `push`: the job became queued in this transaction (queued_at is the transaction's now()).
-- greatest(): an enqueue whose transaction began before the previous holder's (it waited
-- for the lock) never moves the run earlier than that one's quiet time. The run time read in
-- `r` is current: only the key's enqueuers, who hold its lock, change it before the start.
WITH r AS (
    SELECT least(greatest(run_at, now() + %(within_s)s * interval '1 second'),
                 %(first_at)s::timestamptz + %(max_wait_s)s::float8 * interval '1 second')
           AS run_at
      FROM hivejobs_job WHERE id = %(owner)s
)
UPDATE hivejobs_job j
   SET payload = %(payload)s, priority = %(priority)s, expires_at = %(expires_at)s,
       run_at = r.run_at,
       state = CASE WHEN r.run_at > now() THEN 'scheduled' ELSE 'queued' END,
       queued_at = CASE WHEN r.run_at > now() THEN NULL ELSE coalesce(j.queued_at, now()) END
  FROM r
 WHERE j.id = %(owner)s AND j.state IN ('scheduled', 'queued') AND j.started_at IS NULL
RETURNING j.id, j.name, j.state, j.priority, j.state = 'queued' AND j.queued_at = now();

-- name: lock_waiting_for_merge
-- Coalesce: the key's job, if it has not started, locked until the merge is written (a pool
-- claiming it meanwhile waits, then claims the merged payload).
SELECT payload FROM hivejobs_job
 WHERE id = %(owner)s AND state IN ('scheduled', 'queued') AND started_at IS NULL
   FOR UPDATE;

-- name: write_merge
-- Coalesce keeps the window's run time; the most urgent priority and the latest expiry of
-- the merged enqueues (NULL: never expires) hold.
UPDATE hivejobs_job
   SET payload = %(payload)s, priority = least(priority, %(priority)s),
       expires_at = CASE WHEN expires_at IS NULL OR %(expires_at)s::timestamptz IS NULL THEN NULL
                         ELSE greatest(expires_at, %(expires_at)s::timestamptz) END
 WHERE id = %(owner)s
RETURNING id, name, state, priority, false;

-- name: start_debounce_window
-- The key's job started, ended or is gone: this enqueue's job starts a new window.
UPDATE hivejobs_debounce SET job_id = %(id)s, first_at = now() WHERE key = %(key)s;

-- name: prune_debounce
-- Keys whose job has started or ended: the next enqueue of the key would start a new window
-- anyway. The key's job_id is compared with the one read in the CTE's snapshot: a racing
-- enqueuer that started a new window meanwhile (its new job invisible to this snapshot) has
-- changed it, and the re-check of the locked row's new version keeps its key.
WITH stale AS (
    SELECT d.key, d.job_id FROM hivejobs_debounce d
     WHERE NOT EXISTS (SELECT 1 FROM hivejobs_job j
                        WHERE j.id = d.job_id AND j.state IN ('scheduled', 'queued')
                          AND j.started_at IS NULL)
     LIMIT 10000
)
DELETE FROM hivejobs_debounce d USING stale
 WHERE d.key = stale.key AND d.job_id = stale.job_id;
