-- hivejobs schema 13: the Redis boot markers the coordinator has set, one per key prefix. A
-- missing marker in Redis with a row here is a flushed or restarted Redis; with no row, the
-- first start on that prefix (the reconciler restores the lists the same in both cases; only
-- what it logs differs).
-- Never edited once shipped: a schema change is a new file.

CREATE TABLE hivejobs_boot_marker (
    prefix text PRIMARY KEY,
    marker text NOT NULL,
    set_at timestamptz NOT NULL DEFAULT now()
);
