-- hivejobs schema 13: per-partition token buckets (`limit_by` with `rate`).
-- Never edited once shipped: a schema change is a new file.

-- One row per (job type, partition) whose bucket is not full: tokens left at refilled_at (the
-- database clock), taken and refilled in the claim under the type's hivejobs_flow row lock,
-- as the type-wide bucket in hivejobs_flow is. `part` is the limit_by field's JSON text, as
-- the claim reads it from the payload.
-- full_at: when the bucket will have refilled to its burst if nothing takes from it. From
-- then on the row means the same as no row (a missing row is a full bucket), so the
-- coordinator deletes such rows (Pruner, prune_full_buckets): the table holds only the
-- partitions that started jobs within about burst / rate seconds, however many values the
-- field takes.
CREATE TABLE hivejobs_flow_bucket (
    name        text NOT NULL,
    part        text NOT NULL,
    tokens      float8 NOT NULL,
    refilled_at timestamptz NOT NULL,
    full_at     timestamptz NOT NULL,
    PRIMARY KEY (name, part)
);

CREATE INDEX hivejobs_flow_bucket_full ON hivejobs_flow_bucket (full_at);
