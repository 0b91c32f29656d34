-- hivejobs schema 10: each job type's payload JSON Schema, as its worker declared it.
-- Never edited once shipped: a schema change is a new file. Independent of 0004-0009.

-- Written by `hivejobs run` at start (msgspec.json.schema of the handler's payload type),
-- read by enqueuers that do not import the app (`hivejobs enqueue` without --app, another
-- service's App), so that a payload the worker would reject is refused at enqueue and stored
-- nowhere. NULL: the type's payload type has no JSON Schema (refused without the app).
CREATE TABLE hivejobs_payload_schema (
    job_type    text PRIMARY KEY,
    schema      jsonb,
    declared_at timestamptz NOT NULL DEFAULT now()
);
