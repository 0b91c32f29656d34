-- name: upsert_schedule
-- A changed expression or time zone restarts the schedule from now (no backlog is owed).
INSERT INTO hivejobs_schedule (name, job_type, cron, tz, payload, priority, catch_up)
VALUES (%(name)s, %(job_type)s, %(cron)s, %(tz)s, %(payload)s, %(priority)s, %(catch_up)s)
ON CONFLICT (name) DO UPDATE
   SET job_type = EXCLUDED.job_type, payload = EXCLUDED.payload,
       priority = EXCLUDED.priority, catch_up = EXCLUDED.catch_up,
       cron = EXCLUDED.cron, tz = EXCLUDED.tz,
       declared_at = CASE WHEN (hivejobs_schedule.cron, hivejobs_schedule.tz)
                               IS DISTINCT FROM (EXCLUDED.cron, EXCLUDED.tz)
                          THEN now() ELSE hivejobs_schedule.declared_at END,
       last_tick = CASE WHEN (hivejobs_schedule.cron, hivejobs_schedule.tz)
                             IS DISTINCT FROM (EXCLUDED.cron, EXCLUDED.tz)
                        THEN NULL ELSE hivejobs_schedule.last_tick END;

-- name: drop_undeclared_schedules
-- Schedules of the app's own job types that the app no longer declares.
DELETE FROM hivejobs_schedule
 WHERE job_type = ANY(%(job_types)s) AND name <> ALL(%(names)s);

-- name: list_schedules
SELECT name, job_type, cron, tz, payload, priority, catch_up, declared_at, last_tick
  FROM hivejobs_schedule ORDER BY name;

-- name: lock_schedule
-- The row lock orders two coordinators of one moment; the tick they read is then current.
SELECT last_tick FROM hivejobs_schedule WHERE name = %(name)s FOR UPDATE;

-- name: advance_schedule
UPDATE hivejobs_schedule SET last_tick = %(tick)s WHERE name = %(name)s;

-- name: schedule_clock
-- The database's time, and since when `holder` has held the lease in `term` (NULL: it does not).
SELECT now(),
       (SELECT acquired_at FROM hivejobs_leader
         WHERE name = 'coordinator' AND holder = %(holder)s AND term = %(term)s);
