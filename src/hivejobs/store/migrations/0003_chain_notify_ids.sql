-- The traverser's wake-up names the chains whose tries finished, so a hop traverses them
-- at once instead of first searching for work (one round trip less per hop). An empty
-- payload still means "look for work"; it is sent when the list would not fit a NOTIFY.
CREATE OR REPLACE FUNCTION hivejobs_chain_try_finished() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    ids text;
BEGIN
    SELECT string_agg(DISTINCT cj.chain_id, ',') INTO ids
      FROM finished f
      JOIN hivejobs_chain_job cj ON cj.job_id = f.id AND cj.state = 'running';
    IF ids IS NOT NULL THEN
        PERFORM pg_notify('hivejobs_chain', CASE WHEN length(ids) > 7000 THEN '' ELSE ids END);
    END IF;
    RETURN NULL;
END
$$;
