-- hivejobs schema 14: the archive's two statement triggers return at once when nothing could
-- match: no chain job running, no waiter registered. Their queries probed an index
-- per archived row, about a tenth of a pool's Postgres CPU per job with neither in use.
-- Never edited once shipped: a schema change is a new file.
--
-- Each guard reads the rows its trigger's query would join with, in the same statement
-- snapshot that query would have (a PL/pgSQL statement takes a new one, after the archiving
-- statement's delete): when the guard finds none, the query would have found none either.
-- The no-lost-wake-up argument of migration 0012 holds unchanged.

CREATE OR REPLACE FUNCTION hivejobs_chain_try_finished() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    ids text;
BEGIN
    -- Through the running partial index of hivejobs_chain_job: one probe.
    IF NOT EXISTS (SELECT 1 FROM hivejobs_chain_job WHERE state = 'running') THEN
        RETURN NULL;
    END IF;
    SELECT string_agg(DISTINCT cj.chain_id, ',') INTO ids
      FROM finished f
      JOIN hivejobs_chain_job cj ON cj.job_id = f.id AND cj.state = 'running';
    IF ids IS NOT NULL THEN
        PERFORM pg_notify('hivejobs_chain', CASE WHEN length(ids) > 7000 THEN '' ELSE ids END);
    END IF;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION hivejobs_waited_job_finished() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    ids text;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM hivejobs_waiter) THEN
        RETURN NULL;
    END IF;
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
