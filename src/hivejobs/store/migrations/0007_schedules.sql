-- hivejobs schema 7: periodic job schedules and the tick each one reached.
-- Never edited once shipped: a schema change is a new file.

CREATE TABLE hivejobs_schedule (
    name        text PRIMARY KEY,
    job_type    text NOT NULL,
    cron        text NOT NULL,
    tz          text NOT NULL,
    payload     bytea NOT NULL,
    priority    smallint NOT NULL,
    catch_up    boolean NOT NULL,
    declared_at timestamptz NOT NULL DEFAULT now(),
    -- The last tick enqueued, written in the transaction that enqueued it (under the lease).
    last_tick   timestamptz
);
