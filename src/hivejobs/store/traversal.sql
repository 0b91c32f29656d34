-- The traverser's pass over one chain (store/traversal.py), one named block each.
-- Rule numbers (R1..R12) are those of docs/concepts/reliability.md.

-- name: chains_to_traverse
-- New, suspended and woken chains, and chains with a finished try not yet reaped. The join
-- reads the partial index of running chain jobs, so idle chains cost nothing.
SELECT id FROM hivejobs_chain
 WHERE state IN ('pending', 'running', 'suspended')
   AND (state <> 'running' OR wake_at <= now())
UNION
SELECT cj.chain_id FROM hivejobs_chain_job cj
  JOIN hivejobs_archive a ON a.id = cj.job_id
 WHERE cj.state = 'running'
LIMIT %(limit)s;

-- name: load_chain_jobs
-- has_place: a sequenced step holds a place in its key's line (hivejobs_sequence_place).
SELECT cj.key, cj.name, cj.payload, cj.priority, cj.delivery, cj.after_keys, cj.seq, cj.tries,
       cj.retry_wait_s, cj.state, cj.try, cj.total_tries, cj.job_id, cj.not_before, cj.seq_key,
       cj.seq_hold, p.seq IS NOT NULL AS has_place
  FROM hivejobs_chain_job cj
  LEFT JOIN hivejobs_sequence_place p ON p.chain_id = cj.chain_id AND p.step = cj.key
 WHERE cj.chain_id = %(id)s;

-- name: load_chain_sequences
SELECT start_key, retries, retry_wait_s, seq_try FROM hivejobs_chain_sequence
 WHERE chain_id = %(id)s;

-- name: finished_tries
-- Tries of running chain jobs that reached the archive: what the reaper collects.
SELECT cj.key, a.id, a.state, a.error, a.result, a.started_at, a.finished_at
  FROM hivejobs_chain_job cj
  JOIN hivejobs_archive a ON a.id = cj.job_id
 WHERE cj.chain_id = %(id)s AND cj.state = 'running';

-- name: update_chain_jobs
-- Fenced by the state each change was computed from (`was`), inside the chain's row lock.
-- `mode` says what happens to the try's details: reap (take them from the finished try),
-- start (a new try: times cleared), reset (sequence retry: all cleared), keep.
UPDATE hivejobs_chain_job cj
   SET state = u.state, try = u.try, total_tries = u.total_tries, job_id = u.job_id,
       not_before = u.not_before,
       started_at = CASE u.mode WHEN 'reap' THEN u.started_at WHEN 'keep' THEN cj.started_at
                    END,
       finished_at = CASE u.mode WHEN 'reap' THEN u.finished_at
                     WHEN 'keep' THEN cj.finished_at END,
       result = CASE u.mode WHEN 'reap' THEN u.result WHEN 'keep' THEN cj.result END,
       error = CASE u.mode WHEN 'reap' THEN u.error WHEN 'reset' THEN NULL
               ELSE coalesce(u.error, cj.error) END,
       status = CASE u.mode WHEN 'reset' THEN NULL ELSE cj.status END
  FROM unnest(%(keys)s::text[], %(was)s::text[], %(states)s::text[], %(tries)s::int[],
              %(totals)s::int[], %(job_ids)s::text[], %(not_befores)s::timestamptz[],
              %(started)s::timestamptz[], %(finished)s::timestamptz[], %(results)s::bytea[],
              %(errors)s::text[], %(modes)s::text[])
       AS u(key, was, state, try, total_tries, job_id, not_before, started_at, finished_at,
            result, error, mode)
 WHERE cj.chain_id = %(id)s AND cj.key = u.key AND cj.state = u.was
RETURNING cj.key;

-- name: insert_job_log
INSERT INTO hivejobs_job_log (chain_id, key, try, name, job_id, seq_try, state, started_at,
                              finished_at, error)
SELECT %(id)s, u.key, u.try, u.name, u.job_id, u.seq_try, u.state, u.started_at,
       u.finished_at, u.error
  FROM unnest(%(keys)s::text[], %(tries)s::int[], %(names)s::text[], %(job_ids)s::text[],
              %(seq_tries)s::int[], %(states)s::text[], %(started)s::timestamptz[],
              %(finished)s::timestamptz[], %(errors)s::text[])
       AS u(key, try, name, job_id, seq_try, state, started_at, finished_at, error)
ON CONFLICT (chain_id, key, try) DO NOTHING;

-- name: place_lock_timeout
-- Around take_places: an enqueuer of the key inside a caller's long transaction holds its
-- counter row to its commit; the pass waits for it only this long (then it is tried again
-- later, see LockBusy in traversal.py), never the whole coordinator behind a request.
SELECT set_config('hivejobs.lock_timeout', current_setting('lock_timeout'), true),
       set_config('lock_timeout', %(timeout_ms)s, true);

-- name: restore_lock_timeout
SELECT set_config('lock_timeout', current_setting('hivejobs.lock_timeout'), true);

-- name: take_places
-- Before insert_tries: each sequenced step starting a try without a place in its key's line
-- takes one, the next number of its key, as an enqueue does (insert_job_in_sequence in
-- sequence.sql): under the key's counter row lock, held to our commit, so a smaller number
-- is always committed first. A step with a place keeps it: a retry has the first try's turn.
-- Counter rows locked in (name, key) order, as sequence_copied locks them.
WITH u AS (
    SELECT u.step, u.name, u.key
      FROM unnest(%(steps)s::text[], %(names)s::text[], %(keys)s::text[]) AS u(step, name, key)
     WHERE NOT EXISTS (SELECT 1 FROM hivejobs_sequence_place p
                        WHERE p.chain_id = %(chain_id)s AND p.step = u.step)
), n AS (
    SELECT name, key, count(*) AS n FROM u GROUP BY name, key
), s AS (
    INSERT INTO hivejobs_sequence (name, key, last_seq)
    SELECT name, key, n FROM n ORDER BY name, key
    ON CONFLICT (name, key) DO UPDATE SET last_seq = hivejobs_sequence.last_seq + EXCLUDED.last_seq,
                                          used_at = now()
    RETURNING name, key, last_seq
)
INSERT INTO hivejobs_sequence_place (chain_id, step, name, key, seq)
SELECT %(chain_id)s, u.step, u.name, u.key,
       s.last_seq - n.n + row_number() OVER (PARTITION BY u.name, u.key ORDER BY u.step)
  FROM u JOIN n USING (name, key) JOIN s USING (name, key);

-- name: insert_tries
-- One hivejobs job per try, attempts = 1: the chain counts tries, not the pool. The id names
-- the try, so an insert repeated after a crash conflicts instead of running it twice.
-- Each try carries the chain's trace context: the chain is one trace (hivejobs/tracing.py).
-- A sequenced step's try takes its step's place (take_places): the key and number of the
-- step, never a hold of its own (seq_hold false): whether a failure holds the key is the
-- chain's to say once the step has failed for good (end_places).
INSERT INTO hivejobs_job (id, name, state, priority, attempts, delivery, payload, run_at,
                          queued_at, trace_context, seq_key, seq)
SELECT u.id, u.name, 'queued', u.priority, 1, u.delivery, u.payload, now(), now(),
       (SELECT c.trace_context FROM hivejobs_chain c WHERE c.id = %(chain_id)s), p.key, p.seq
  FROM unnest(%(ids)s::text[], %(names)s::text[], %(priorities)s::int2[],
              %(deliveries)s::text[], %(payloads)s::bytea[], %(steps)s::text[])
       AS u(id, name, priority, delivery, payload, step)
  LEFT JOIN hivejobs_sequence_place p ON p.chain_id = %(chain_id)s AND p.step = u.step
ON CONFLICT (id) DO NOTHING
RETURNING id, name, priority;

-- name: end_places
-- After update_chain_jobs: the places of steps ended for good or with their chain go, a
-- failure for good under on_failure="hold" holds the key, and each key is handed to its
-- next job (hivejobs_sequence_end_places, migration 0024); the jobs unparked, to push.
SELECT id, name, priority FROM hivejobs_sequence_end_places(%(chain_id)s, %(steps)s::text[],
                                                            %(holds)s::bool[]);

-- name: update_sequence_tries
UPDATE hivejobs_chain_sequence s SET seq_try = u.seq_try
  FROM unnest(%(starts)s::text[], %(seq_tries)s::int[]) AS u(start_key, seq_try)
 WHERE s.chain_id = %(id)s AND s.start_key = u.start_key;

-- name: commit_async
-- This transaction may commit without waiting for the WAL flush (see TraversalStore.traverse).
SELECT set_config('synchronous_commit', 'off', true);

-- name: update_chain
UPDATE hivejobs_chain
   SET state = %(state)s, wake_at = %(wake_at)s,
       started_at = coalesce(started_at, CASE WHEN %(state)s <> 'pending' THEN now() END),
       resumed_at = CASE WHEN %(resumed)s THEN now() ELSE resumed_at END,
       finished_at = CASE WHEN %(state)s IN ('succeeded', 'failed', 'stopped') THEN now() END
 WHERE id = %(id)s;

-- name: abandon_tries
-- Past the stop timeout: tries that ignored ctx.stopping end cancelled here, as spincycle
-- gives up on them. The handler may still run in its pool, but its completion is fenced out
-- (claim token, R3); the archive insert wakes the traverser, which reaps them as stopped.
WITH done AS (
    DELETE FROM hivejobs_job
     WHERE id = ANY(%(ids)s::text[]) AND state IN ('queued', 'scheduled', 'running')
    RETURNING *
)
INSERT INTO hivejobs_archive (id, name, state, priority, attempt, attempts, delivery, payload,
                              created_at, run_at, started_at, finished_at, expires_at, error,
                              claim_token)
SELECT id, name, 'cancelled', priority, attempt, attempts, delivery, payload, created_at,
       run_at, started_at, now(), expires_at, %(error)s, claim_token
  FROM done
RETURNING id;
