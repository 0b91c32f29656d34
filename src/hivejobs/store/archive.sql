-- Listing and upkeep statements (store/upkeep.py), one named block each, as in queries.sql.

-- name: list_jobs
-- Live and archived jobs, newest first, keyset-paged on (at, id): `at` is finished_at for a
-- finished job, created_at for a live one. Each side is limited before the merge, so a page
-- reads at most 2 x limit rows whatever the archive holds. Every filter is optional (NULL).
SELECT * FROM (
    (SELECT id, name, state, attempt, attempts, priority, created_at, run_at, started_at,
            NULL::timestamptz AS finished_at, expires_at, error, created_at AS at
       FROM hivejobs_job
      WHERE (%(states)s::text[] IS NULL OR state = ANY(%(states)s::text[]))
        AND (%(name)s::text IS NULL OR name = %(name)s::text)
        AND (%(since)s::timestamptz IS NULL OR created_at >= %(since)s::timestamptz)
        AND (%(since_s)s::float8 IS NULL
             OR created_at >= now() - %(since_s)s::float8 * interval '1 second')
        AND (%(until)s::timestamptz IS NULL OR created_at < %(until)s::timestamptz)
        AND (%(after_at)s::timestamptz IS NULL
             OR (created_at, id) < (%(after_at)s::timestamptz, %(after_id)s::text))
      ORDER BY created_at DESC, id DESC LIMIT %(limit)s)
    UNION ALL
    (SELECT id, name, state, attempt, attempts, priority, created_at, run_at, started_at,
            finished_at, expires_at, error, finished_at AS at
       FROM hivejobs_archive
      WHERE (%(states)s::text[] IS NULL OR state = ANY(%(states)s::text[]))
        AND (%(name)s::text IS NULL OR name = %(name)s::text)
        AND (%(since)s::timestamptz IS NULL OR finished_at >= %(since)s::timestamptz)
        AND (%(since_s)s::float8 IS NULL
             OR finished_at >= now() - %(since_s)s::float8 * interval '1 second')
        AND (%(until)s::timestamptz IS NULL OR finished_at < %(until)s::timestamptz)
        AND (%(after_at)s::timestamptz IS NULL
             OR (finished_at, id) < (%(after_at)s::timestamptz, %(after_id)s::text))
      ORDER BY finished_at DESC, id DESC LIMIT %(limit)s)
) jobs
ORDER BY at DESC, id DESC LIMIT %(limit)s;

-- name: nonzero_gauge_types
-- Types with a gauge above zero: a type whose jobs all ended appears in no count, so the
-- gauges pass must zero these or they keep their last value for ever.
SELECT DISTINCT queue FROM hivejobs_gauge WHERE value <> 0;

-- name: set_type_retentions
-- Each registered type's archive retention (NULL: the global archive_retention_s).
UPDATE hivejobs_job_type t SET retention_s = u.retention_s
  FROM unnest(%(names)s::text[], %(retentions)s::float8[]) AS u(name, retention_s)
 WHERE t.name = u.name AND t.retention_s IS DISTINCT FROM u.retention_s;

-- name: prune_archive_by_type
-- Each type's own retention, else the global one; the shortest of them all bounds the scan
-- of hivejobs_archive_finished.
DELETE FROM hivejobs_archive
 WHERE id IN (
    SELECT a.id FROM hivejobs_archive a
      LEFT JOIN hivejobs_job_type t ON t.name = a.name
     WHERE a.finished_at < now() - (SELECT least(%(retention_s)s::float8, min(retention_s))
                                      FROM hivejobs_job_type) * interval '1 second'
       AND a.finished_at < now() - coalesce(t.retention_s, %(retention_s)s::float8)
                                   * interval '1 second'
     LIMIT %(limit)s);
