-- hivejobs schema 24: a chain step of a sequenced type keeps one place in its key's line
-- across the chain's tries of it (sequence.py, store/sequence.sql, store/traversal.sql).
-- Never edited once shipped: a schema change is a new file.

-- A chain step's key (the sequence_by field's JSON text) and whether a failure for good
-- holds it (on_failure="hold"), recorded when the step is stored, as an enqueue records them
-- on a job. NULL: not sequenced.
ALTER TABLE hivejobs_chain_job
    ADD COLUMN seq_key text,
    ADD COLUMN seq_hold boolean NOT NULL DEFAULT false;

-- A sequenced chain step's place in its key's line: the number the step took when the chain
-- created its first try (take_places in traversal.sql), under the key's counter row lock as
-- an enqueue takes one. Every try of the step is a job with that number, and the place stays
-- while the chain may still try the step again (between tries, while its chain sequence
-- waits for a retry, while the chain is suspended): a job of the key with a larger number
-- starts only after the place is gone (claim_in_sequence, hand_over). It goes when a try
-- succeeds (hivejobs_sequence_job_gone below) or when the traverser sees the step ended for
-- good or its chain ended (hivejobs_sequence_end_places). The cascade only spares a pruned
-- chain a leftover row: the sequencer's repair hands over a key nothing holds any more.
CREATE TABLE hivejobs_sequence_place (
    chain_id text NOT NULL REFERENCES hivejobs_chain (id) ON DELETE CASCADE,
    step     text NOT NULL,
    name     text NOT NULL,
    key      text NOT NULL,
    seq      bigint NOT NULL,
    PRIMARY KEY (chain_id, step)
);
CREATE INDEX hivejobs_sequence_place_key ON hivejobs_sequence_place (name, key, seq);

-- As in migration 23, with places: the key's next job is unparked only if no place of a
-- chain step comes before it.
CREATE OR REPLACE FUNCTION hivejobs_sequence_hand_over(p_name text, p_key text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    nxt record;
BEGIN
    IF EXISTS (SELECT 1 FROM hivejobs_sequence_hold h WHERE h.name = p_name AND h.key = p_key)
       OR EXISTS (SELECT 1 FROM hivejobs_job r
                   WHERE r.name = p_name AND r.seq_key = p_key AND r.state = 'running') THEN
        RETURN NULL;
    END IF;
    SELECT id, state, priority, queued_at, seq INTO nxt FROM hivejobs_job
     WHERE name = p_name AND seq_key = p_key ORDER BY seq LIMIT 1;
    IF NOT FOUND OR nxt.state <> 'queued' OR nxt.queued_at IS NOT NULL THEN
        RETURN NULL;
    END IF;
    IF EXISTS (SELECT 1 FROM hivejobs_sequence_place p
                WHERE p.name = p_name AND p.key = p_key AND p.seq < nxt.seq) THEN
        RETURN NULL;  -- a chain step between its tries comes first
    END IF;
    UPDATE hivejobs_job SET queued_at = now() WHERE id = nxt.id;
    IF current_setting('hivejobs.hand_over_push', true) IS DISTINCT FROM 'pool' THEN
        PERFORM pg_notify('hivejobs_dispatch',
                          p_name || chr(9) || nxt.priority || chr(9) || nxt.id);
    END IF;
    RETURN nxt.id;
END
$$;

-- As in migration 17, and a chain step's try that succeeded gives up its step's place in
-- the same transaction, before the hand-over: the key goes on at the completion, as after a
-- plain job, without waiting for the traverser. Its (name, key, seq) names the place: a
-- number is given once per key. A try that failed keeps the place: the chain decides.
CREATE OR REPLACE FUNCTION hivejobs_sequence_job_gone() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    k record;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM gone WHERE seq_key IS NOT NULL) THEN
        RETURN NULL;
    END IF;
    FOR k IN SELECT name, seq_key FROM gone WHERE seq_key IS NOT NULL
              GROUP BY name, seq_key
              ORDER BY hashtext(name || chr(31) || seq_key), name, seq_key LOOP
        PERFORM hivejobs_sequence_lock(k.name, k.seq_key);
    END LOOP;
    INSERT INTO hivejobs_sequence_hold (name, key, job_id, seq, error)
    SELECT g.name, g.seq_key, g.id, g.seq, a.error
      FROM gone g JOIN hivejobs_archive a ON a.id = g.id
     WHERE g.seq_key IS NOT NULL AND g.seq_hold AND a.state = 'failed'
    ON CONFLICT (name, key) DO NOTHING;
    DELETE FROM hivejobs_sequence_place p
     USING gone g JOIN hivejobs_archive a ON a.id = g.id
     WHERE g.seq_key IS NOT NULL AND a.state = 'succeeded'
       AND p.name = g.name AND p.key = g.seq_key AND p.seq = g.seq;
    FOR k IN SELECT DISTINCT name, seq_key FROM gone WHERE seq_key IS NOT NULL LOOP
        PERFORM hivejobs_sequence_hand_over(k.name, k.seq_key);
    END LOOP;
    RETURN NULL;
END
$$;

-- The traverser's end of places (end_places in traversal.sql), in its pass's transaction
-- under the chain's row lock (so chain row, then keys: the order of every path that ends a
-- try). `p_steps` ended for good or with their chain; where `p_holds` says so (the step
-- failed for good, on_failure="hold") the key is held by the step's last try, with its
-- error, at the step's number, as a plain job's failure holds it: a replay of that try takes
-- the place. Then each key is handed to its next job. Returns the jobs unparked, for the
-- traverser to push (their NOTIFY goes out too: a duplicate push is refused by the claim).
CREATE FUNCTION hivejobs_sequence_end_places(p_chain text, p_steps text[], p_holds boolean[])
RETURNS TABLE (id text, name text, priority smallint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    k record;
    unparked text;
BEGIN
    FOR k IN SELECT DISTINCT p.name, p.key, hashtext(p.name || chr(31) || p.key) AS h
               FROM hivejobs_sequence_place p
              WHERE p.chain_id = p_chain AND p.step = ANY(p_steps)
              ORDER BY h, p.name, p.key LOOP
        PERFORM hivejobs_sequence_lock(k.name, k.key);
    END LOOP;
    INSERT INTO hivejobs_sequence_hold (name, key, job_id, seq, error)
    SELECT p.name, p.key, cj.job_id, p.seq, cj.error
      FROM unnest(p_steps, p_holds) AS u(step, hold)
      JOIN hivejobs_sequence_place p ON p.chain_id = p_chain AND p.step = u.step
      JOIN hivejobs_chain_job cj ON cj.chain_id = p_chain AND cj.key = u.step
     WHERE u.hold AND cj.job_id IS NOT NULL
    ON CONFLICT ON CONSTRAINT hivejobs_sequence_hold_pkey DO NOTHING;
    FOR k IN DELETE FROM hivejobs_sequence_place p
              WHERE p.chain_id = p_chain AND p.step = ANY(p_steps)
              RETURNING p.name, p.key LOOP
        unparked := hivejobs_sequence_hand_over(k.name, k.key);
        IF unparked IS NOT NULL THEN
            RETURN QUERY SELECT j.id, j.name, j.priority FROM hivejobs_job j
                          WHERE j.id = unparked;
        END IF;
    END LOOP;
END
$$;
