-- hivejobs schema 16: a job type's fair_by field (broker/fair.py), declared by its workers, so
-- that a client without the type's code (the CLI, `hivejobs serve`) refuses a payload without
-- the field and can show the type's keys. NULL: the type is not fair.
-- Never edited once shipped: a schema change is a new file.

ALTER TABLE hivejobs_job_type ADD COLUMN fair_by text;
