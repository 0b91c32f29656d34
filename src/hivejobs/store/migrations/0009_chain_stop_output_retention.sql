-- hivejobs schema 9: chain stop timeout, captured output per try, archive retention per type.
-- Never edited once shipped: a schema change is a new file. Independent of 0004-0008.

-- When a stop gives up on tries that ignore ctx.stopping (NULL: no stop requested).
ALTER TABLE hivejobs_chain ADD COLUMN stop_by timestamptz;

-- Bounded stdout and stderr of one chain try (spincycle's job log keeps its output). Written
-- by the pool before the try's completion; read beside the job-log row by job id. Only tries
-- that printed something have a row; it goes with its chain.
CREATE TABLE hivejobs_try_output (
    job_id     text PRIMARY KEY,
    chain_id   text NOT NULL REFERENCES hivejobs_chain (id) ON DELETE CASCADE,
    stdout     text,
    stderr     text,
    truncated  boolean NOT NULL DEFAULT false
);

CREATE INDEX hivejobs_try_output_chain ON hivejobs_try_output (chain_id);

-- Per job type: how long its finished jobs stay in the archive (NULL: the global setting).
ALTER TABLE hivejobs_job_type ADD COLUMN retention_s double precision;

-- No new index on hivejobs_archive: `hivejobs jobs --type T` walks hivejobs_archive_finished
-- backwards, and building an index here would lock a big archive's inserts (every
-- completion) for the whole migration, as migrations run in one transaction.
