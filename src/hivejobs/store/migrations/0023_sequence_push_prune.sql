-- hivejobs schema 23: a sequence key's hand-over pushed by the completion that ends its job,
-- and idle sequence counters pruned (sequence.py, store/sequence.sql).
-- Never edited once shipped: a schema change is a new file.

-- When an enqueue last numbered a job of the key. A key with no live job and no hold, idle
-- past the archive retention, loses its row (prune_idle in store/sequence.sql): its next
-- enqueue numbers from 1 again, which orders nothing differently since nothing of the key
-- is live. Not indexed: the prune reads the table rarely, and an index would make every
-- enqueue's update of the row a non-HOT one.
ALTER TABLE hivejobs_sequence ADD COLUMN used_at timestamptz NOT NULL DEFAULT now();

-- As in migration 17, but the dispatch NOTIFY is left out when the statement that ended the
-- key's job was a pool's completion batch (it sets hivejobs.hand_over_push in its
-- transaction, archive_finished_if_running in jobs.sql): that pool pushes the unparked job
-- itself right after its commit (handed_over_at in sequence.sql), with or without a
-- listening coordinator, and the NOTIFY would only push it a second time. A pool that dies
-- before its push leaves a queued job with a queued_at, which the reconciler pushes.
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
    SELECT id, state, priority, queued_at INTO nxt FROM hivejobs_job
     WHERE name = p_name AND seq_key = p_key ORDER BY seq LIMIT 1;
    IF NOT FOUND OR nxt.state <> 'queued' OR nxt.queued_at IS NOT NULL THEN
        RETURN NULL;
    END IF;
    UPDATE hivejobs_job SET queued_at = now() WHERE id = nxt.id;
    IF current_setting('hivejobs.hand_over_push', true) IS DISTINCT FROM 'pool' THEN
        PERFORM pg_notify('hivejobs_dispatch',
                          p_name || chr(9) || nxt.priority || chr(9) || nxt.id);
    END IF;
    RETURN nxt.id;
END
$$;
