-- hivejobs schema 11: waiting for a job's end (app.wait): one row per waiter, and a
-- NOTIFY naming the waited-for jobs when they finish, on whichever path archived them.
-- Never edited once shipped: a schema change is a new file.

CREATE TABLE hivejobs_waiter (
    job_id text NOT NULL,
    waiter uuid NOT NULL,
    since  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, waiter)
);

-- A waiter's row is committed while it holds a FOR KEY SHARE lock on the live job row
-- (watch_job), and a job is archived by deleting that row first: so either the waiter saw
-- no live row (the job had finished) or this trigger's query, which runs after the delete
-- and in a newer snapshot, sees the waiter. No wake-up is lost in between.
-- Without waiters it costs one index probe per finished job.
CREATE FUNCTION hivejobs_waited_job_finished() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    ids text;
BEGIN
    SELECT string_agg(f.id, ',') INTO ids
      FROM finished f
     WHERE EXISTS (SELECT 1 FROM hivejobs_waiter w WHERE w.job_id = f.id);
    IF ids IS NOT NULL THEN
        -- Too long for one NOTIFY: an empty payload, every waiter looks at its job again.
        PERFORM pg_notify('hivejobs_done', CASE WHEN length(ids) > 7000 THEN '' ELSE ids END);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER hivejobs_waited_job_finished
    AFTER INSERT ON hivejobs_archive
    REFERENCING NEW TABLE AS finished
    FOR EACH STATEMENT EXECUTE FUNCTION hivejobs_waited_job_finished();
