-- hivejobs schema 20: the last progress a running job reported (ctx.progress), so that a
-- reader who connects late, or after the job ended, sees where it got to. The live events
-- travel over Redis pub/sub; this row is only the latest of them, written by the pool at a
-- bounded rate (store/progress.py) and once more when the attempt ends.
-- Never edited once shipped: a schema change is a new file.
--
-- A table of its own, not columns of hivejobs_job: the job moves to the archive when it
-- ends, and its progress must stay readable afterwards without the archiving statement
-- copying it. The coordinator's prune drops rows older than the retention whose job is no
-- longer live.

CREATE TABLE hivejobs_progress (
    job_id     text PRIMARY KEY,
    attempt    integer NOT NULL,
    done       double precision NOT NULL,
    total      double precision,
    note       text,
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX hivejobs_progress_updated ON hivejobs_progress (updated_at);
