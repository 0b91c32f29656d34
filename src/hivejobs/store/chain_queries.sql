-- Chain statements (store/chains.py), one named block each.
-- Rule numbers (R1..R12) are those of docs/concepts/reliability.md.

-- name: insert_chain
INSERT INTO hivejobs_chain (id, name, args, jobs, trace_context)
VALUES (%(id)s, %(name)s, %(args)s, %(jobs)s, %(trace_context)s);

-- name: insert_chain_jobs
-- `added_by`: NULL for a chain's declared jobs, the adding job's key for ctx.chain.add.
-- `seq_key`/`seq_hold`: a sequenced step's key and on_failure (NULL/false: not sequenced).
INSERT INTO hivejobs_chain_job (chain_id, key, name, payload, priority, delivery, after_keys,
                                seq, tries, retry_wait_s, added_by, seq_key, seq_hold)
SELECT %(chain_id)s, u.key, u.name, u.payload, u.priority, u.delivery,
       CASE WHEN u.after_keys = '' THEN '{}'::text[] ELSE string_to_array(u.after_keys, ' ') END,
       u.seq, u.tries, u.retry_wait_s, %(added_by)s::text, u.seq_key, u.seq_hold
  FROM unnest(%(keys)s::text[], %(names)s::text[], %(payloads)s::bytea[], %(priorities)s::int2[],
              %(deliveries)s::text[], %(afters)s::text[], %(seqs)s::text[], %(tries)s::int[],
              %(waits)s::float8[], %(seq_keys)s::text[], %(seq_holds)s::bool[])
       AS u(key, name, payload, priority, delivery, after_keys, seq, tries, retry_wait_s,
            seq_key, seq_hold);

-- name: insert_chain_sequences
INSERT INTO hivejobs_chain_sequence (chain_id, start_key, retries, retry_wait_s)
SELECT %(chain_id)s, u.start_key, u.retries, u.retry_wait_s
  FROM unnest(%(starts)s::text[], %(retries)s::int[], %(waits)s::float8[])
       AS u(start_key, retries, retry_wait_s);

-- name: wake_traverser
-- Delivered on commit. The payload names chains to traverse (comma-separated, as the
-- try-finished trigger sends them); empty means "look for work" (chains_to_traverse).
SELECT pg_notify('hivejobs_chain', %(id)s);

-- name: lock_chain
-- The row lock orders the traverser with stop_chain and with suspensions written by pools.
SELECT id, state, stop_requested, now() AS now, stop_by FROM hivejobs_chain
 WHERE id = %(id)s AND state IN ('pending', 'running', 'suspended')
   FOR UPDATE;

-- name: suspend_chain_tries
-- A pool suspends chain tries on shutdown: unlike a plain job (requeued, R9) the try ends
-- here, uncounted: its hivejobs job is archived cancelled with the attempt given back, the
-- chain job is stopped with its try uncounted and a job-log row, the chain suspended. The
-- traverser resumes it with a new try. Fenced by claim token like every end of a claim (R3).
WITH c AS (
    SELECT * FROM unnest(%(ids)s::text[], %(tokens)s::bigint[]) AS c(id, token)
), tries AS (
    SELECT j.id, cj.chain_id, cj.key
      FROM hivejobs_job j
      JOIN c ON j.id = c.id AND j.state = 'running' AND j.claim_token = c.token
      JOIN hivejobs_chain_job cj ON cj.job_id = j.id AND cj.state = 'running'
     WHERE j.id = ANY(%(ids)s::text[])
), gone AS (
    -- Found by primary key, as in archive_finished_if_running.
    DELETE FROM hivejobs_job j USING tries t
     WHERE j.id = ANY(%(ids)s::text[]) AND j.id = t.id
    RETURNING j.*
), archived AS (
    INSERT INTO hivejobs_archive (id, name, state, priority, attempt, attempts, delivery,
                                  payload, created_at, run_at, started_at, finished_at,
                                  expires_at, error, claim_token)
    SELECT id, name, 'cancelled', priority, attempt - 1, attempts, delivery, payload,
           created_at, run_at, started_at, now(), expires_at,
           'interrupted by shutdown: chain suspended', claim_token
      FROM gone
    RETURNING id, started_at
), stopped AS (
    UPDATE hivejobs_chain_job cj
       SET state = 'stopped', try = cj.try - 1, finished_at = now(),
           started_at = a.started_at
      FROM tries t JOIN archived a ON a.id = t.id
     WHERE cj.chain_id = t.chain_id AND cj.key = t.key
    RETURNING cj.chain_id, cj.key, cj.total_tries, cj.name, cj.job_id, cj.seq, a.started_at
), logged AS (
    INSERT INTO hivejobs_job_log (chain_id, key, try, name, job_id, seq_try, state,
                                  started_at, finished_at, error)
    SELECT s.chain_id, s.key, s.total_tries, s.name, s.job_id, q.seq_try, 'stopped',
           s.started_at, now(), 'interrupted by shutdown'
      FROM stopped s
      LEFT JOIN hivejobs_chain_sequence q ON q.chain_id = s.chain_id AND q.start_key = s.seq
    ON CONFLICT DO NOTHING
), suspended AS (
    UPDATE hivejobs_chain ch
       SET state = 'suspended', suspended_at = now(), suspensions = suspensions + 1
     WHERE ch.id IN (SELECT chain_id FROM stopped) AND ch.state IN ('pending', 'running')
)
SELECT id FROM archived;

-- name: request_stop
-- A repeated stop keeps the first deadline: asking again does not grant more time.
UPDATE hivejobs_chain
   SET stop_requested = true, wake_at = now(),
       stop_by = coalesce(stop_by, now() + %(timeout_s)s * interval '1 second')
 WHERE id = %(id)s AND state IN ('pending', 'running', 'suspended')
RETURNING id;

-- name: cancel_waiting_tries
-- Tries not yet claimed end cancelled now; the traverser stops their chain jobs.
WITH done AS (
    DELETE FROM hivejobs_job
     WHERE id IN (SELECT job_id FROM hivejobs_chain_job
                   WHERE chain_id = %(id)s AND state = 'running')
       AND state IN ('queued', 'scheduled')
    RETURNING *
)
INSERT INTO hivejobs_archive (id, name, state, priority, attempt, attempts, delivery, payload,
                              created_at, run_at, started_at, finished_at, expires_at, error)
SELECT id, name, 'cancelled', priority, attempt, attempts, delivery, payload, created_at,
       run_at, started_at, now(), expires_at, 'chain stopped'
  FROM done
RETURNING id;

-- name: cancel_running_tries
UPDATE hivejobs_job SET cancel_requested = true
 WHERE id IN (SELECT job_id FROM hivejobs_chain_job
               WHERE chain_id = %(id)s AND state = 'running')
   AND state = 'running'
RETURNING id;

-- name: get_chain
SELECT id, name, state, args, stop_requested, suspensions, created_at, started_at,
       suspended_at, resumed_at, finished_at
  FROM hivejobs_chain WHERE id = %(id)s;

-- name: chain_job_rows
-- A running try's start time comes from its live job row until the reaper copies it, and so
-- does what the try is doing now (queued for a worker, or running), as `chain ps` reads it.
SELECT cj.key, cj.name AS type, cj.state, cj.after_keys AS after, cj.seq AS sequence,
       cj.try AS "try", cj.tries, cj.total_tries, q.seq_try AS sequence_try, cj.job_id,
       coalesce(cj.started_at, CASE WHEN cj.state = 'running' THEN j.started_at END)
           AS started_at,
       cj.finished_at, cj.status, cj.result, cj.error, j.state AS job_state, cj.added_by
  FROM hivejobs_chain_job cj
  LEFT JOIN hivejobs_job j ON j.id = cj.job_id AND cj.state = 'running'
  LEFT JOIN hivejobs_chain_sequence q ON q.chain_id = cj.chain_id AND q.start_key = cj.seq
 WHERE cj.chain_id = %(id)s
 ORDER BY cj.key;

-- name: job_log
-- Each try's captured output sits beside its log row (hivejobs_try_output, by job id).
SELECT l.key, l.try AS "try", l.name AS type, l.job_id, l.seq_try AS sequence_try, l.state,
       l.started_at, l.finished_at,
       extract(epoch FROM l.finished_at - l.started_at)::float8 AS duration_s, l.error,
       o.stdout, o.stderr, coalesce(o.truncated, false) AS output_truncated
  FROM hivejobs_job_log l
  LEFT JOIN hivejobs_try_output o ON o.job_id = l.job_id
 WHERE l.chain_id = %(id)s
 ORDER BY l.finished_at, l.key, l.try;

-- name: save_try_output
-- Written by the pool before the try's completion, so the output is there when the try's
-- log row appears. A job that is not a running chain try inserts nothing.
INSERT INTO hivejobs_try_output (job_id, chain_id, stdout, stderr, truncated)
SELECT %(job_id)s, cj.chain_id, %(stdout)s, %(stderr)s, %(truncated)s
  FROM hivejobs_chain_job cj
 WHERE cj.job_id = %(job_id)s AND cj.state = 'running'
ON CONFLICT (job_id) DO NOTHING;

-- name: list_chains
-- Newest first, keyset-paged on (created_at, id) over hivejobs_chain_created; every filter
-- is optional (NULL).
SELECT c.id, c.name, c.state, c.jobs,
       (SELECT count(*) FROM hivejobs_chain_job cj
         WHERE cj.chain_id = c.id AND cj.state = 'succeeded')::int AS succeeded,
       c.created_at, c.finished_at
  FROM hivejobs_chain c
 WHERE (%(states)s::text[] IS NULL OR c.state = ANY(%(states)s::text[]))
   AND (%(type)s::text IS NULL OR c.name = %(type)s::text)
   AND (%(job_type)s::text IS NULL
        OR EXISTS (SELECT 1 FROM hivejobs_chain_job cj
                    WHERE cj.chain_id = c.id AND cj.name = %(job_type)s::text))
   AND (%(since)s::timestamptz IS NULL OR c.created_at >= %(since)s::timestamptz)
   AND (%(until)s::timestamptz IS NULL OR c.created_at < %(until)s::timestamptz)
   AND (%(before_at)s::timestamptz IS NULL
        OR (c.created_at, c.id) < (%(before_at)s::timestamptz, %(before_id)s::text))
 ORDER BY c.created_at DESC, c.id DESC LIMIT %(limit)s;

-- name: running_tries
-- spincycle's `ps`: every try of a live chain job now, with the process running it. Reads
-- the partial index of running chain jobs.
SELECT cj.chain_id, c.name AS chain, cj.key, cj.name AS type, cj.try AS "try", cj.tries,
       cj.total_tries, j.state, w.host, w.pid, cj.status, j.started_at,
       extract(epoch FROM now() - coalesce(j.started_at, j.queued_at, j.created_at))::float8
           AS age_s
  FROM hivejobs_chain_job cj
  JOIN hivejobs_chain c ON c.id = cj.chain_id
  LEFT JOIN hivejobs_job j ON j.id = cj.job_id
  LEFT JOIN hivejobs_worker w ON w.id = j.worker_id
 WHERE cj.state = 'running'
 ORDER BY j.started_at NULLS LAST, cj.chain_id, cj.key
 LIMIT %(limit)s;

-- name: try_context
-- What a handler's ctx.chain needs, found by the chain and key its try's job id names (the
-- primary key: job_id alone has only a partial index, and a lookup by it would scan every
-- chain job of the database), while that try is the chain job's current one.
SELECT cj.chain_id, cj.key, cj.total_tries, cj.after_keys, c.args
  FROM hivejobs_chain_job cj JOIN hivejobs_chain c ON c.id = cj.chain_id
 WHERE cj.chain_id = %(id)s AND cj.key = %(key)s AND cj.job_id = %(job_id)s;

-- name: upstream_results
SELECT key, result FROM hivejobs_chain_job
 WHERE chain_id = %(id)s AND key = ANY(%(keys)s::text[]);

-- name: set_status
-- Only the current try may write: a late write from an ended try changes nothing.
UPDATE hivejobs_chain_job SET status = %(status)s
 WHERE job_id = %(job_id)s AND state = 'running'
RETURNING key;

-- name: ancestors
-- Every job a chain job runs after, directly or not (walks after_keys up the DAG).
WITH RECURSIVE up(key) AS (
    SELECT unnest(after_keys) FROM hivejobs_chain_job
     WHERE chain_id = %(id)s AND key = %(key)s
    UNION
    SELECT unnest(cj.after_keys) FROM hivejobs_chain_job cj
      JOIN up ON cj.chain_id = %(id)s AND cj.key = up.key
)
SELECT key FROM up;

-- name: growing_try
-- ctx.chain.add: the key of the chain job whose current try is `job_id`, while that try
-- still runs (its job row not archived: not rescued, abandoned or cancelled meanwhile).
SELECT cj.key FROM hivejobs_chain_job cj
  JOIN hivejobs_job j ON j.id = cj.job_id AND j.state = 'running'
 WHERE cj.chain_id = %(id)s AND cj.job_id = %(job_id)s AND cj.state = 'running';

-- name: growth_rows
SELECT key, after_keys, state, seq, added_by FROM hivejobs_chain_job WHERE chain_id = %(id)s;

-- name: count_added_jobs
UPDATE hivejobs_chain SET jobs = jobs + %(n)s WHERE id = %(id)s;

-- name: wait_for_added_jobs
-- ctx.chain.add(before=...): a pending job below the adding one also waits for added jobs.
-- Fenced on pending; under the chain's row lock nothing else changes a pending job.
UPDATE hivejobs_chain_job cj
   SET after_keys = cj.after_keys || string_to_array(u.afters, ' ')
  FROM unnest(%(keys)s::text[], %(afters)s::text[]) AS u(key, afters)
 WHERE cj.chain_id = %(id)s AND cj.key = u.key AND cj.state = 'pending';
