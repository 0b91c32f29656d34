-- hivejobs schema 10: flow control, one row per job type that is paused or limited.
-- Never edited once shipped: a schema change is a new file.

-- paused: no pool claims the type's jobs (claim_queued checks it in the claim itself); kept
-- here, not in Redis, so a pause survives restarts and flushes.
-- tokens, refilled_at: the type's fleet-wide token bucket (rate limit), taken and refilled
-- under this row's lock in the claim transaction, on the database clock.
-- concurrency: `hivejobs scale`, runner threads per pool process of the type, fleet-wide
-- (NULL: the job type's own `concurrency` option).
-- The limits themselves (global_concurrency, rate) are job type options in the code; the
-- running slots are the type's `running` rows, so a dead holder's slot comes back when the
-- coordinator rescues its claims.
CREATE TABLE hivejobs_flow (
    name        text PRIMARY KEY,
    paused      boolean NOT NULL DEFAULT false,
    paused_at   timestamptz,
    tokens      float8 NOT NULL DEFAULT 0,
    refilled_at timestamptz NOT NULL DEFAULT now(),
    concurrency integer CHECK (concurrency > 0)
);
