-- name: declare_payload_schema
-- The latest worker to start wins, as for the job type row itself.
INSERT INTO hivejobs_payload_schema (job_type, schema)
VALUES (%(job_type)s, %(schema)s)
ON CONFLICT (job_type) DO UPDATE
   SET schema = EXCLUDED.schema, declared_at = now();

-- name: payload_schema
SELECT schema FROM hivejobs_payload_schema WHERE job_type = %(job_type)s;
