-- hivejobs schema 18: batches with callbacks (docs/howto/batches.md).
-- Never edited once shipped: a schema change is a new file.
--
-- A batch is a row of counters. Adding jobs raises `pending` in the transaction that stores
-- them (store/batches.py); a statement trigger on the archive lowers it in the transaction
-- that ends them, on whichever path archived them (completion, rescue, cancel, expiry). The
-- transaction that brings `pending` to zero on a sealed batch also stores its callback jobs:
-- deciding it in Postgres, under the batch row's lock, is what makes the callback exactly
-- once whatever dies (pool, coordinator) and however many last jobs end at once.

CREATE TABLE hivejobs_batch (
    id                text PRIMARY KEY,
    on_complete       text,
    complete_attempts integer,
    complete_delivery text,
    on_success        text,
    success_attempts  integer,
    success_delivery  text,
    priority          smallint NOT NULL DEFAULT 0,
    data              bytea NOT NULL,  -- canonical JSON, handed to the callbacks
    sealed            boolean NOT NULL DEFAULT false,
    total             integer NOT NULL DEFAULT 0,
    pending           integer NOT NULL DEFAULT 0,
    succeeded         integer NOT NULL DEFAULT 0,
    failed            integer NOT NULL DEFAULT 0,
    cancelled         integer NOT NULL DEFAULT 0,
    expired           integer NOT NULL DEFAULT 0,
    created_at        timestamptz NOT NULL DEFAULT now(),
    sealed_at         timestamptz,
    completed_at      timestamptz,
    complete_job_id   text,
    success_job_id    text,
    CHECK (pending >= 0)
);

CREATE INDEX hivejobs_batch_completed ON hivejobs_batch (completed_at)
    WHERE completed_at IS NOT NULL;
-- The counting trigger's guard: with no batch still to complete, an archive insert returns
-- after one probe of this (small) index, whatever dead rows a past batch left behind.
CREATE INDEX hivejobs_batch_incomplete ON hivejobs_batch (id) WHERE completed_at IS NULL;

-- Live members only: a row is deleted when its job ends, so this table stays as small as
-- hivejobs_job.
CREATE TABLE hivejobs_batch_job (
    job_id   text PRIMARY KEY,
    batch_id text NOT NULL
);

-- Members that ended other than succeeded: the callbacks' and `batch status`'s failed ids.
CREATE TABLE hivejobs_batch_failed (
    batch_id text NOT NULL,
    job_id   text NOT NULL,
    name     text NOT NULL,
    state    text NOT NULL,
    PRIMARY KEY (batch_id, job_id)
);

-- Stores the batch's callback jobs once its last job has ended and it is sealed. The guard
-- is the UPDATE's WHERE: the caller holds the batch row's lock (it just updated the row), and
-- a concurrent transaction that ended another job waits for that lock, then re-reads the
-- row (READ COMMITTED) and finds completed_at set. So it happens once, in the transaction
-- that made the batch done, and a rollback of that transaction undoes it all.
-- The dispatch NOTIFY uses the payload of store/notify.py (type TAB priority TAB id); a lost
-- one (no coordinator listening) costs latency only: the reconciler pushes queued jobs.
CREATE FUNCTION hivejobs_batch_finish_if_done(p_batch text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    b hivejobs_batch%ROWTYPE;
    v_report jsonb;
    v_ids jsonb;
    v_job text;
BEGIN
    UPDATE hivejobs_batch SET completed_at = now()
     WHERE id = p_batch AND sealed AND pending = 0 AND completed_at IS NULL
    RETURNING * INTO b;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    SELECT coalesce(jsonb_agg(x.job_id ORDER BY x.job_id), '[]'::jsonb) INTO v_ids
      FROM (SELECT job_id FROM hivejobs_batch_failed WHERE batch_id = b.id
             ORDER BY job_id LIMIT 1000) x;
    v_report := jsonb_build_object(
        'batch_id', b.id, 'total', b.total, 'succeeded', b.succeeded, 'failed', b.failed,
        'cancelled', b.cancelled, 'expired', b.expired, 'failed_ids', v_ids,
        'failed_ids_truncated', b.total - b.succeeded > 1000,
        'data', convert_from(b.data, 'UTF8')::jsonb);
    IF b.on_complete IS NOT NULL THEN
        v_job := b.id || ':complete';
        INSERT INTO hivejobs_job (id, name, state, priority, attempts, delivery, payload,
                                  run_at, queued_at)
        VALUES (v_job, b.on_complete, 'queued', b.priority, b.complete_attempts,
                b.complete_delivery,
                convert_to((v_report || '{"event": "complete"}'::jsonb)::text, 'UTF8'),
                now(), now())
        ON CONFLICT (id) DO NOTHING;
        PERFORM pg_notify('hivejobs_dispatch',
                          b.on_complete || E'\t' || b.priority || E'\t' || v_job);
        UPDATE hivejobs_batch SET complete_job_id = v_job WHERE id = b.id;
    END IF;
    IF b.on_success IS NOT NULL AND b.succeeded = b.total THEN
        v_job := b.id || ':success';
        INSERT INTO hivejobs_job (id, name, state, priority, attempts, delivery, payload,
                                  run_at, queued_at)
        VALUES (v_job, b.on_success, 'queued', b.priority, b.success_attempts,
                b.success_delivery,
                convert_to((v_report || '{"event": "success"}'::jsonb)::text, 'UTF8'),
                now(), now())
        ON CONFLICT (id) DO NOTHING;
        PERFORM pg_notify('hivejobs_dispatch',
                          b.on_success || E'\t' || b.priority || E'\t' || v_job);
        UPDATE hivejobs_batch SET success_job_id = v_job WHERE id = b.id;
    END IF;
END
$$;

-- Counts the batch jobs an archiving statement ended, in that statement's transaction.
-- Batches are updated one by one in id order, so two transactions that end jobs of the same
-- batches lock their rows in the same order and cannot deadlock on them.
CREATE FUNCTION hivejobs_batch_jobs_ended() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_batches text[];
    v_n int[];
    v_ok int[];
    v_failed int[];
    v_cancelled int[];
    v_expired int[];
BEGIN
    IF NOT EXISTS (SELECT 1 FROM hivejobs_batch WHERE completed_at IS NULL) THEN
        RETURN NULL;
    END IF;
    WITH gone AS (
        DELETE FROM hivejobs_batch_job bj USING finished f
         WHERE bj.job_id = f.id
        RETURNING bj.batch_id, f.id, f.name, f.state
    ), kept AS (
        INSERT INTO hivejobs_batch_failed (batch_id, job_id, name, state)
        SELECT batch_id, id, name, state FROM gone WHERE state <> 'succeeded'
        ON CONFLICT DO NOTHING
    ), counts AS (
        SELECT batch_id, count(*)::int AS n,
               (count(*) FILTER (WHERE state = 'succeeded'))::int AS ok,
               (count(*) FILTER (WHERE state = 'failed'))::int AS bad,
               (count(*) FILTER (WHERE state = 'cancelled'))::int AS c,
               (count(*) FILTER (WHERE state = 'expired'))::int AS e
          FROM gone GROUP BY batch_id
    )
    SELECT array_agg(batch_id ORDER BY batch_id), array_agg(n ORDER BY batch_id),
           array_agg(ok ORDER BY batch_id), array_agg(bad ORDER BY batch_id),
           array_agg(c ORDER BY batch_id), array_agg(e ORDER BY batch_id)
      INTO v_batches, v_n, v_ok, v_failed, v_cancelled, v_expired
      FROM counts;
    FOR i IN 1 .. coalesce(array_length(v_batches, 1), 0) LOOP
        UPDATE hivejobs_batch
           SET pending = pending - v_n[i], succeeded = succeeded + v_ok[i],
               failed = failed + v_failed[i], cancelled = cancelled + v_cancelled[i],
               expired = expired + v_expired[i]
         WHERE id = v_batches[i];
        PERFORM hivejobs_batch_finish_if_done(v_batches[i]);
    END LOOP;
    RETURN NULL;
END
$$;

CREATE TRIGGER hivejobs_batch_jobs_ended
    AFTER INSERT ON hivejobs_archive
    REFERENCING NEW TABLE AS finished
    FOR EACH STATEMENT EXECUTE FUNCTION hivejobs_batch_jobs_ended();
