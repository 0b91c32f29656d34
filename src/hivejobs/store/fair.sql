-- Fair dispatch (store/fair.py): the key of each job of a `fair_by` type, read from its payload.
-- The key is the field's text (->>: "acme" and 42 as acme and 42); a payload without the field
-- (stored by a client that did not know the type's fair_by) or with null there is the '' key.

-- name: fair_keys
-- The sorter: the key and priority of each popped id still queued for this type. Primary-key
-- lookups only; ids no longer queued (claimed, cancelled, another type's) are left out.
SELECT id, priority,
       coalesce(convert_from(payload, 'UTF8')::jsonb ->> %(field)s, '') AS key
  FROM hivejobs_job
 WHERE id = ANY(%(ids)s::text[]) AND state = 'queued' AND name = %(name)s;

-- name: fair_key_counts
-- An operator's view (API, CLI, dashboard): live jobs per key, busiest first. Reads the type's
-- live rows, so it is for a person asking, never for a loop.
SELECT key,
       count(*) FILTER (WHERE state = 'queued')::int AS queued,
       count(*) FILTER (WHERE state = 'running')::int AS running,
       count(*) FILTER (WHERE state = 'scheduled')::int AS scheduled
  FROM (SELECT state, coalesce(convert_from(payload, 'UTF8')::jsonb ->> %(field)s, '') AS key
          FROM hivejobs_job WHERE name = %(name)s) j
 GROUP BY key
 ORDER BY count(*) FILTER (WHERE state = 'queued') DESC, key
 LIMIT %(limit)s;
