-- Sequences per key (store/sequence.py, sequence.py; schema in migrations 0017, 0023, 0024).

-- name: insert_job_in_sequence
-- insert_job (jobs.sql) for a sequenced type: the job takes the next number of its key in the
-- same statement. The key's row stays locked until the enqueuer commits, so numbers are given
-- in commit order: a smaller number is always visible to whoever sees a larger one. An id
-- that exists already (ON CONFLICT) leaves a gap, which orders nothing differently.
WITH s AS (
    INSERT INTO hivejobs_sequence (name, key, last_seq) VALUES (%(name)s, %(seq_key)s, 1)
    ON CONFLICT (name, key) DO UPDATE SET last_seq = hivejobs_sequence.last_seq + 1,
                                          used_at = now()
    RETURNING last_seq
), v AS (
    SELECT coalesce(%(run_at)s::timestamptz,
                    now() + %(delay_s)s::float8 * interval '1 second',
                    now()) AS run_at
)
INSERT INTO hivejobs_job (id, name, state, priority, attempts, delivery, payload,
                          run_at, queued_at, expires_at, seq_key, seq, seq_hold)
SELECT %(id)s, %(name)s,
       CASE WHEN v.run_at > now() THEN 'scheduled' ELSE 'queued' END,
       %(priority)s, %(attempts)s, %(delivery)s, %(payload)s,
       v.run_at, CASE WHEN v.run_at > now() THEN NULL ELSE now() END, %(expires_at)s,
       %(seq_key)s, s.last_seq, %(seq_hold)s
  FROM v, s
ON CONFLICT (id) DO NOTHING
RETURNING id, name, state, priority;

-- name: sequence_copied
-- enqueue_many (COPY) of a sequenced type, in the COPY's transaction: each key takes as many
-- numbers as it has jobs in the batch, given in the batch's order. Keys locked in sorted order.
WITH j AS (
    SELECT u.id, u.key, u.ord
      FROM unnest(%(ids)s::text[], %(keys)s::text[]) WITH ORDINALITY AS u(id, key, ord)
), n AS (
    SELECT key, count(*) AS n FROM j GROUP BY key
), s AS (
    INSERT INTO hivejobs_sequence (name, key, last_seq)
    SELECT %(name)s, key, n FROM n ORDER BY key
    ON CONFLICT (name, key) DO UPDATE SET last_seq = hivejobs_sequence.last_seq + EXCLUDED.last_seq,
                                          used_at = now()
    RETURNING key, last_seq
), r AS (
    SELECT j.id, j.key,
           s.last_seq - n.n + row_number() OVER (PARTITION BY j.key ORDER BY j.ord) AS seq
      FROM j JOIN n USING (key) JOIN s USING (key)
)
UPDATE hivejobs_job t SET seq_key = r.key, seq = r.seq, seq_hold = %(hold)s
  FROM r WHERE t.id = r.id;

-- name: lock_keys
-- First statement of a sequenced claim: the keys of the popped ids, each key's lock taken in
-- one order (the hash, as the hand-over trigger does) so that claims and hand-overs never
-- deadlock. The statements after it see every claim and hand-over of these keys committed
-- before ours.
-- The ids are found by primary key alone: `seq_key IS NOT NULL` is tested above the scan
-- (in it, it would imply the key index's predicate; see park_waiting).
SELECT CASE WHEN k.seq_key IS NOT NULL THEN hivejobs_sequence_lock(k.name, k.seq_key) END
  FROM (SELECT name, seq_key, hashtext(name || chr(31) || seq_key) AS h FROM hivejobs_job
         WHERE id = ANY(%(ids)s) AND name = %(name)s
         GROUP BY name, seq_key
         ORDER BY h, name, seq_key) k;

-- name: claim_in_sequence
-- claim_queued (jobs.sql) with the sequence guard, under the keys' locks: a job starts only
-- if its key is not held, no job of its key runs (a callback's wait included), and no live
-- job of its key came before it, nor a chain step's place (a step between its tries: its
-- retry has its turn; hivejobs_sequence_place, migration 0024). The locks make the guard exact: no other claim of the key
-- commits between this statement's snapshot and our commit. A row without a key (enqueued
-- before the type was sequenced) is claimed as an unsequenced job. started_at is this
-- statement's time, after the locks (not the transaction's start, which may come before the
-- previous job's completion): so the archive itself shows each job of a key starting after
-- the previous one finished, on the database clock.
UPDATE hivejobs_job j
   SET state = 'running', attempt = attempt + 1, worker_id = %(worker_id)s,
       claim_token = nextval('hivejobs_claim_seq'), started_at = clock_timestamp()
 WHERE j.id = ANY(%(ids)s) AND j.state = 'queued' AND j.name = %(name)s
   AND (j.expires_at IS NULL OR j.expires_at > now())
   AND NOT EXISTS (SELECT 1 FROM hivejobs_flow f WHERE f.name = %(name)s AND f.paused)
   AND (j.seq_key IS NULL OR (
        NOT EXISTS (SELECT 1 FROM hivejobs_sequence_hold h
                     WHERE h.name = j.name AND h.key = j.seq_key)
        AND NOT EXISTS (SELECT 1 FROM hivejobs_job r
                         WHERE r.name = j.name AND r.seq_key = j.seq_key
                           AND r.state = 'running')
        AND NOT EXISTS (SELECT 1 FROM hivejobs_job b
                         WHERE b.name = j.name AND b.seq_key = j.seq_key AND b.seq < j.seq)
        AND NOT EXISTS (SELECT 1 FROM hivejobs_sequence_place p
                         WHERE p.name = j.name AND p.key = j.seq_key AND p.seq < j.seq)))
RETURNING id, name, attempt, attempts, delivery, payload, claim_token, priority, lost,
          extract(epoch FROM now() - run_at)::float8 AS pickup_s;

-- name: park_waiting
-- Under the keys' locks, after claim_in_sequence: popped ids that wait for their key (held,
-- running, or behind an earlier job or chain step's place) leave the dispatch path: queued_at NULL keeps them out of
-- the reconciler's queued index and out of flow_refused, so they are not pushed again until
-- the key's hand-over (migration 0017) unparks the next one. Parking under the same lock as
-- the hand-over means a job is never parked after its key was handed to it. No condition on
-- queued_at: with it the WHERE clause would imply the queued index's predicate (see
-- queued_at_of in maintenance.sql) and a plan could read the queue; parking a parked row
-- again changes nothing. Nor `seq_key IS NOT NULL` (a row without a key matches none of the
-- EXISTS): with it, the key index's predicate is implied and a plan ANDed that index (every
-- sequenced row of the type) with the primary key.
UPDATE hivejobs_job j SET queued_at = NULL
 WHERE j.id = ANY(%(ids)s) AND j.state = 'queued' AND j.name = %(name)s
   AND (EXISTS (SELECT 1 FROM hivejobs_sequence_hold h
                 WHERE h.name = j.name AND h.key = j.seq_key)
        OR EXISTS (SELECT 1 FROM hivejobs_job r
                    WHERE r.name = j.name AND r.seq_key = j.seq_key AND r.state = 'running')
        OR EXISTS (SELECT 1 FROM hivejobs_job b
                    WHERE b.name = j.name AND b.seq_key = j.seq_key AND b.seq < j.seq)
        OR EXISTS (SELECT 1 FROM hivejobs_sequence_place p
                    WHERE p.name = j.name AND p.key = j.seq_key AND p.seq < j.seq))
RETURNING j.id;

-- name: lock_key
SELECT hivejobs_sequence_lock(%(name)s, %(key)s);

-- name: hand_over
-- Under the key's lock: unpark the key's next job if it may start (migration 0017).
SELECT hivejobs_sequence_hand_over(%(name)s, %(key)s);

-- name: release_hold
-- Under the key's lock: the operator lets the key go on past its failed job.
DELETE FROM hivejobs_sequence_hold WHERE name = %(name)s AND key = %(key)s
RETURNING job_id;

-- name: hold_of
SELECT job_id, seq FROM hivejobs_sequence_hold WHERE name = %(name)s AND key = %(key)s;

-- name: take_hold_place
-- Under the key's lock, for the replay of the job that holds the key: the replay takes the
-- held job's number, so it is the key's next job, and the hold ends. Only while the hold
-- still names that job.
WITH h AS (
    DELETE FROM hivejobs_sequence_hold
     WHERE name = %(name)s AND key = %(key)s AND job_id = %(held)s
    RETURNING seq
)
UPDATE hivejobs_job SET seq = h.seq FROM h
 WHERE id = %(id)s AND name = %(name)s AND seq_key = %(key)s
RETURNING id;

-- name: keys
-- The keys of a type with live jobs, a chain step's place or a hold: counts per state, the
-- next job, and the hold. The next job is a chain step's (its current or last try) when the
-- step's place comes before every live job of the key: it waits for the chain's retry and
-- the key waits for it. Reads the type's sequenced live rows through hivejobs_job_seq.
WITH live AS (
    SELECT seq_key AS key,
           count(*) FILTER (WHERE state = 'queued')::int AS queued,
           count(*) FILTER (WHERE state = 'scheduled')::int AS scheduled,
           count(*) FILTER (WHERE state = 'running')::int AS running,
           (array_agg(id ORDER BY seq))[1] AS next_id, min(seq) AS first_seq
      FROM hivejobs_job WHERE name = %(name)s AND seq_key IS NOT NULL
     GROUP BY seq_key
), placed AS (
    SELECT DISTINCT ON (p.key) p.key, p.seq, cj.job_id
      FROM hivejobs_sequence_place p
      JOIN hivejobs_chain_job cj ON cj.chain_id = p.chain_id AND cj.key = p.step
     WHERE p.name = %(name)s
     ORDER BY p.key, p.seq
), lines AS (
    SELECT coalesce(l.key, pl.key) AS key, coalesce(l.queued, 0) AS queued,
           coalesce(l.scheduled, 0) AS scheduled, coalesce(l.running, 0) AS running,
           CASE WHEN pl.seq < l.first_seq OR l.key IS NULL THEN pl.job_id ELSE l.next_id END
               AS next_id
      FROM live l FULL JOIN placed pl ON pl.key = l.key
)
SELECT coalesce(l.key, h.key) AS key, coalesce(l.queued, 0) AS queued,
       coalesce(l.scheduled, 0) AS scheduled, coalesce(l.running, 0) AS running,
       l.next_id, h.job_id AS held_by, h.error AS held_error, h.held_at
  FROM lines l
  FULL JOIN (SELECT * FROM hivejobs_sequence_hold WHERE name = %(name)s) h ON h.key = l.key
 ORDER BY (h.key IS NULL), coalesce(l.key, h.key)
 LIMIT %(limit)s;

-- name: held_counts
-- The metrics' gauge: held keys per type, never per key.
SELECT name, count(*)::int FROM hivejobs_sequence_hold GROUP BY name;

-- name: holds
-- A type's held keys, oldest hold first (the hold table holds only held keys).
SELECT key, job_id, error, held_at FROM hivejobs_sequence_hold WHERE name = %(name)s
 ORDER BY held_at, key LIMIT %(limit)s;

-- name: stalled_keys
-- The repair of the hand-over (coordinator/sequencer.py): keys whose next job is parked
-- although nothing holds the key back (no hold, nothing running, no chain step's place
-- before it). The hand-over trigger
-- unparks such a job in the transaction that ends the previous one, so none should exist:
-- this finds one a path missed. Walks the key index one key at a time (each step LIMIT 1 in
-- index order, as oldest_queued walks the queues): an entry or two per key.
WITH RECURSIVE k AS (
    (SELECT name, seq_key FROM hivejobs_job WHERE seq_key IS NOT NULL
      ORDER BY name, seq_key LIMIT 1)
    UNION ALL
    SELECT n.name, n.seq_key
      FROM k, LATERAL (
          SELECT name, seq_key FROM hivejobs_job
           WHERE seq_key IS NOT NULL AND (name, seq_key) > (k.name, k.seq_key)
           ORDER BY name, seq_key LIMIT 1) n
)
SELECT k.name, k.seq_key
  FROM k, LATERAL (SELECT state, queued_at, seq FROM hivejobs_job h
                    WHERE h.name = k.name AND h.seq_key = k.seq_key
                    ORDER BY h.seq LIMIT 1) nxt
 WHERE nxt.state = 'queued' AND nxt.queued_at IS NULL
   AND NOT EXISTS (SELECT 1 FROM hivejobs_sequence_place p
                    WHERE p.name = k.name AND p.key = k.seq_key AND p.seq < nxt.seq)
   AND NOT EXISTS (SELECT 1 FROM hivejobs_sequence_hold h
                    WHERE h.name = k.name AND h.key = k.seq_key)
   AND NOT EXISTS (SELECT 1 FROM hivejobs_job r
                    WHERE r.name = k.name AND r.seq_key = k.seq_key AND r.state = 'running')
 LIMIT %(limit)s;

-- name: handed_over
-- After hand_over: the job it unparked, for the repair to push at once.
SELECT id, name, priority FROM hivejobs_job WHERE id = %(id)s AND state = 'queued';

-- name: handed_over_at
-- After a completion batch archived sequenced jobs (their keys given): the next job of each
-- key that the hand-over trigger unparked in that batch's transaction, whose queued_at it set
-- to that transaction's now() (`at`), for the completer to push at once: a hand-over then
-- waits for no NOTIFY (none reaches a coordinator behind a transaction-mode pooler without
-- a listen URL). A next job with another queued_at was dispatched already (pushed at
-- enqueue and not yet popped): pushing it again would only add a duplicate. One index step
-- per key (hivejobs_job_seq).
SELECT n.id, n.name, n.priority, n.state
  FROM unnest(%(names)s::text[], %(keys)s::text[]) AS k(name, key),
       LATERAL (SELECT j.id, j.name, j.priority, j.state, j.queued_at FROM hivejobs_job j
                 WHERE j.name = k.name AND j.seq_key = k.key
                 ORDER BY j.seq LIMIT 1) n
 WHERE n.state = 'queued' AND n.queued_at = %(at)s;

-- name: lock_idle
-- The first statement of the prune of idle counters (prune_idle): rows of keys with no live
-- job, no hold and no chain step's place, last used more than the retention ago, locked. SKIP LOCKED passes over a
-- row an enqueuer holds (it numbers a job of the key until its commit: the key is not idle);
-- an enqueuer that comes after waits for our lock. No index on used_at (see migration 0023):
-- a read of the table, at most once per SEQUENCE_PRUNE_EVERY_S (coordinator/pruner.py).
SELECT s.name, s.key FROM hivejobs_sequence s
 WHERE s.used_at < now() - %(retention_s)s * interval '1 second'
   AND NOT EXISTS (SELECT 1 FROM hivejobs_job j WHERE j.name = s.name AND j.seq_key = s.key)
   AND NOT EXISTS (SELECT 1 FROM hivejobs_sequence_hold h
                    WHERE h.name = s.name AND h.key = s.key)
   AND NOT EXISTS (SELECT 1 FROM hivejobs_sequence_place p
                    WHERE p.name = s.name AND p.key = s.key)
 LIMIT %(limit)s
   FOR UPDATE OF s SKIP LOCKED;

-- name: delete_idle
-- The second statement, in lock_idle's transaction, under its row locks: a new snapshot, so
-- it sees every job an enqueuer numbered before we took the row (lock_idle's own snapshot
-- may be older than that enqueuer's commit), and deletes the row only if the key still has
-- no live job and no hold. A key's number restarts only when nothing of the key is live: no
-- job can then be numbered before one still waiting.
DELETE FROM hivejobs_sequence s
 USING unnest(%(names)s::text[], %(keys)s::text[]) AS k(name, key)
 WHERE s.name = k.name AND s.key = k.key
   AND s.used_at < now() - %(retention_s)s * interval '1 second'
   AND NOT EXISTS (SELECT 1 FROM hivejobs_job j WHERE j.name = s.name AND j.seq_key = s.key)
   AND NOT EXISTS (SELECT 1 FROM hivejobs_sequence_hold h
                    WHERE h.name = s.name AND h.key = s.key)
   AND NOT EXISTS (SELECT 1 FROM hivejobs_sequence_place p
                    WHERE p.name = s.name AND p.key = s.key)
RETURNING s.key;

-- name: parked_counts
-- Queued jobs parked behind their key (out of Redis), per type, for the queue-depth gauge
-- (queued_counts in maintenance.sql counts the dispatched ones). Reads the sequenced live
-- rows through hivejobs_job_seq.
SELECT name, count(*)::int FROM hivejobs_job
 WHERE seq_key IS NOT NULL AND state = 'queued' AND queued_at IS NULL
 GROUP BY name;
