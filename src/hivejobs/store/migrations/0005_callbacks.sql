-- hivejobs schema 5: rickover's status callbacks.
-- Never edited once shipped: a schema change is a new file. Numbered 5 because
-- 0004 came first; migrate applies every version above the recorded one, in order.
--
-- A job type declared `callback=True` hands its work to another service: when its handler
-- returns, the job stays `running` with no worker (worker_id NULL, so no rescue touches it)
-- and a callback deadline, until that service posts the outcome for that attempt. The
-- coordinator ends (retries or fails) jobs whose deadline passed.

ALTER TABLE hivejobs_job_type
    ADD COLUMN callback boolean NOT NULL DEFAULT false,
    ADD COLUMN callback_timeout_s double precision;

ALTER TABLE hivejobs_job ADD COLUMN callback_deadline timestamptz;

CREATE INDEX hivejobs_job_callback ON hivejobs_job (callback_deadline)
    WHERE callback_deadline IS NOT NULL;

-- The dashboard's failed-jobs page reads failed jobs newest first by keyset (finished_at, id):
-- one index descent per page at any archive size. Partial, so that the archive inserts of
-- succeeded jobs (nearly all of them) pay nothing for it.
CREATE INDEX hivejobs_archive_failed ON hivejobs_archive (finished_at, id) WHERE state = 'failed';
