-- hivejobs schema 17: sequences per key (`sequence_by`, sequence.py): at most one job of a
-- key runs at a time, in enqueue order.
-- Never edited once shipped: a schema change is a new file.

-- A sequenced job's key (the sequence_by field's JSON text), its place in the key's line
-- (taken from hivejobs_sequence.last_seq at enqueue, under that row's lock, so a smaller
-- number always committed first) and whether a failure for good holds the key
-- (on_failure="hold", as declared when it was enqueued). NULL: not sequenced.
ALTER TABLE hivejobs_job
    ADD COLUMN seq_key text,
    ADD COLUMN seq bigint,
    ADD COLUMN seq_hold boolean NOT NULL DEFAULT false;

-- As declared by the worker fleet (upsert_job_type): a client that enqueues by name without
-- the decorator (the CLI, another service) numbers and checks its jobs the same way.
ALTER TABLE hivejobs_job_type
    ADD COLUMN sequence_by text,
    ADD COLUMN on_failure text;

-- The claim guard's two questions, both within one key: is there a live job before this one,
-- is one of the key running. Partial: unsequenced rows cost nothing.
CREATE INDEX hivejobs_job_seq ON hivejobs_job (name, seq_key, seq) WHERE seq_key IS NOT NULL;
CREATE INDEX hivejobs_job_seq_running ON hivejobs_job (name, seq_key)
    WHERE seq_key IS NOT NULL AND state = 'running';

-- One row per (type, key) ever enqueued: the last number given. Locked by enqueuers of that
-- key only (until their commit); nothing on a pool's path locks it.
CREATE TABLE hivejobs_sequence (
    name     text NOT NULL,
    key      text NOT NULL,
    last_seq bigint NOT NULL,
    PRIMARY KEY (name, key)
);

-- A key held by a job that failed for good (on_failure="hold"): nothing of the key starts
-- until an operator replays that job (it runs first) or releases the key.
CREATE TABLE hivejobs_sequence_hold (
    name    text NOT NULL,
    key     text NOT NULL,
    job_id  text NOT NULL,
    seq     bigint NOT NULL,
    error   text,
    held_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (name, key)
);

-- The per-key lock that serialises a key's claims and the hand-over to its next job. An
-- advisory lock, not a row's: enqueuers (possibly inside a caller's long transaction) never
-- take it, so a pool never waits on a web request. Two-key form in its own class id, so it
-- never meets the one-key locks (migrate's). A hash collision only serialises two keys more.
CREATE FUNCTION hivejobs_sequence_lock(p_name text, p_key text) RETURNS void
LANGUAGE sql AS $$
    SELECT pg_advisory_xact_lock(1936027953, hashtext(p_name || chr(31) || p_key));
$$;

-- A sequenced job left the live table (succeeded, failed, cancelled, expired: archived):
-- under its key's lock, hold the key if it failed for good with on_failure="hold", else
-- hand the key to its next job: the live job of the key with the smallest number, if queued
-- and parked (queued_at NULL, see sequence.py), gets its queued_at and a dispatch NOTIFY
-- (hivejobs_dispatch, the payload of store/notify.py: type, priority, id). A lost NOTIFY is
-- repaired by the reconciler, which sees the unparked job as any queued one. A statement
-- trigger: one pass per completion batch, and at once when no sequenced row is in it.
-- The archive rows of the same statement are visible here (an AFTER trigger's queries run
-- after the whole statement).
CREATE FUNCTION hivejobs_sequence_job_gone() RETURNS trigger LANGUAGE plpgsql AS $$
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
    FOR k IN SELECT DISTINCT name, seq_key FROM gone WHERE seq_key IS NOT NULL LOOP
        PERFORM hivejobs_sequence_hand_over(k.name, k.seq_key);
    END LOOP;
    RETURN NULL;
END
$$;

-- Under the key's lock: unpark the key's next job unless the key is held or runs a job.
-- Returns the id unparked (NULL: none).
CREATE FUNCTION hivejobs_sequence_hand_over(p_name text, p_key text) RETURNS text
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
    PERFORM pg_notify('hivejobs_dispatch', p_name || chr(9) || nxt.priority || chr(9) || nxt.id);
    RETURN nxt.id;
END
$$;

CREATE TRIGGER hivejobs_sequence_job_gone AFTER DELETE ON hivejobs_job
    REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT EXECUTE FUNCTION hivejobs_sequence_job_gone();
