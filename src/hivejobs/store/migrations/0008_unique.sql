-- hivejobs schema 8: unique windows, one row per unique key while its window lasts.
-- Never edited once shipped: a schema change is a new file.

CREATE TABLE hivejobs_unique (
    key    text PRIMARY KEY,
    job_id text NOT NULL,
    until  timestamptz NOT NULL
);
