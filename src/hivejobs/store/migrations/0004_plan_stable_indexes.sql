-- hivejobs schema 4: partial indexes that no lookup by id can use.
-- Never edited once shipped: a schema change is a new file.
--
-- Postgres may use a partial index only for a statement whose WHERE clause implies the index
-- predicate. The claim says `state = 'queued'` and the end of a claim `state = 'running'`, so
-- with the predicates of 0001 both could be planned through a whole partial index instead of
-- the primary key, and were whenever the statistics made that index look small: none at all
-- (autovacuum off), an ANALYZE of an empty table, or one of a full queue (nothing running). A
-- scan of the queue or of the running set per claim or per completion batch is O(queue).
--
-- Each partial index now also requires a column that the statements it serves constrain and
-- that no lookup by id mentions: `queued_at` for the queue (keyset pages, the reconciler),
-- `worker_id` for the running set (rescue, a pool's own claims). A strict comparison on that
-- column (`worker_id = ...`, `queued_at < ...`) implies IS NOT NULL, so those statements keep
-- their index; the id lookups cannot prove the predicate and are left with the primary key,
-- whatever the statistics say. Every queued row has a queued_at and every running row a
-- worker_id (claim, promote, requeue and release set them together with the state), so the
-- indexes hold the same rows as before.
--
-- The queued index also leads with the queue (name, priority): the reconciler walks one
-- queue's oldest entries, and in (queued_at, id) order it had to step over every other
-- queue's backlog to find them.
--
-- The hot table is small when this runs (live jobs only); the rebuild locks it briefly.

DROP INDEX hivejobs_job_queued;
CREATE INDEX hivejobs_job_queued ON hivejobs_job (name, priority, queued_at, id)
    WHERE state = 'queued' AND queued_at IS NOT NULL;

DROP INDEX hivejobs_job_running;
CREATE INDEX hivejobs_job_running ON hivejobs_job (worker_id)
    WHERE state = 'running' AND worker_id IS NOT NULL;

-- Waiting jobs whose cancel was requested while they ran (the Promoter ends them when their
-- retry comes up): found here instead of by a scan of the whole table on every pass.
CREATE INDEX hivejobs_job_cancel_requested ON hivejobs_job (id) WHERE cancel_requested;
