-- Schema versions, the database clock, session settings (store/db.py, migrate.py).

-- name: db_now
-- The database clock, which every time in the schema is judged on.
SELECT now();

-- name: create_database
-- The name is an identifier composed by psycopg.sql: CREATE DATABASE takes no parameters.
CREATE DATABASE {dbname};

-- name: settings_in_force
SELECT name, setting FROM pg_settings WHERE name = ANY(%(names)s);

-- name: migration_lock
-- "HIVE": serialises concurrent `hivejobs migrate` runs, released at the transaction's end.
SELECT pg_advisory_xact_lock(%(key)s);

-- name: create_version_table
CREATE TABLE IF NOT EXISTS hivejobs_schema_version (
    version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now());

-- name: applied_versions
SELECT version FROM hivejobs_schema_version;

-- name: record_version
INSERT INTO hivejobs_schema_version (version, name) VALUES (%(version)s, %(name)s);

-- name: version_table_exists
SELECT to_regclass('hivejobs_schema_version') IS NOT NULL;

-- name: applied_version_array
SELECT array_agg(version) FROM hivejobs_schema_version;
