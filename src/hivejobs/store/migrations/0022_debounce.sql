-- hivejobs schema 22: debounce and coalesce keys (hivejobs/debounce.py), one row per key.
-- Never edited once shipped: a schema change is a new file.
--
-- The row is the key's lock: every enqueue of the key takes it (store/debounce.sql) and holds
-- it until its transaction ends, so racing enqueuers of one key, in any process, decide one
-- after another. `job_id` is the job the key's enqueues go into while it has not started;
-- `first_at` is the first enqueue of that job, from which `max_wait` is counted.

CREATE TABLE hivejobs_debounce (
    key      text PRIMARY KEY,
    job_id   text NOT NULL,
    first_at timestamptz NOT NULL
);
