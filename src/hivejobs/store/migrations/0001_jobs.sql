-- hivejobs schema 1: live jobs, archive, job types, workers, leader lease, gauges.
-- Never edited once shipped: a schema change is a new file.

CREATE TABLE hivejobs_job_type (
    name        text PRIMARY KEY,
    concurrency integer NOT NULL,
    processes   integer NOT NULL,
    attempts    integer NOT NULL,
    delivery    text NOT NULL,
    timeout_s   double precision,
    updated_at  timestamptz NOT NULL DEFAULT now()
);

CREATE SEQUENCE hivejobs_claim_seq CACHE 100;

-- The hot table: only live jobs (scheduled, queued, running). Finished jobs move to the
-- archive in the same statement that finishes them, so this table stays small.
CREATE TABLE hivejobs_job (
    id               text PRIMARY KEY,
    name             text NOT NULL,
    state            text NOT NULL CHECK (state IN ('scheduled', 'queued', 'running')),
    priority         smallint NOT NULL DEFAULT 0,
    attempt          integer NOT NULL DEFAULT 0,
    attempts         integer NOT NULL,
    delivery         text NOT NULL,
    payload          bytea NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    run_at           timestamptz NOT NULL DEFAULT now(),
    queued_at        timestamptz,
    expires_at       timestamptz,
    started_at       timestamptz,
    worker_id        uuid,
    claim_token      bigint,
    lost             integer NOT NULL DEFAULT 0,
    cancel_requested boolean NOT NULL DEFAULT false,
    error            text
) WITH (fillfactor = 80);

CREATE INDEX hivejobs_job_due ON hivejobs_job (run_at) WHERE state = 'scheduled';
CREATE INDEX hivejobs_job_queued ON hivejobs_job (queued_at, id) WHERE state = 'queued';
CREATE INDEX hivejobs_job_running ON hivejobs_job (worker_id) WHERE state = 'running';
CREATE INDEX hivejobs_job_expiring ON hivejobs_job (expires_at) WHERE expires_at IS NOT NULL;

CREATE TABLE hivejobs_archive (
    id          text PRIMARY KEY,
    name        text NOT NULL,
    state       text NOT NULL CHECK (state IN ('succeeded', 'failed', 'cancelled', 'expired')),
    priority    smallint NOT NULL,
    attempt     integer NOT NULL,
    attempts    integer NOT NULL,
    delivery    text NOT NULL,
    payload     bytea NOT NULL,
    created_at  timestamptz NOT NULL,
    run_at      timestamptz NOT NULL,
    started_at  timestamptz,
    finished_at timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz,
    error       text,
    result      bytea,
    claim_token bigint
);

CREATE INDEX hivejobs_archive_finished ON hivejobs_archive (finished_at);

-- One row per process start (a fresh uuid each time: R4).
CREATE TABLE hivejobs_worker (
    id           uuid PRIMARY KEY,
    host         text NOT NULL,
    pid          integer NOT NULL,
    role         text NOT NULL,
    pool         text,
    started_at   timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL DEFAULT now()
);

-- The coordinator lease: one row, a term that grows on every change of holder (R7).
CREATE TABLE hivejobs_leader (
    name        text PRIMARY KEY,
    holder      uuid,
    term        bigint NOT NULL DEFAULT 0,
    acquired_at timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL
);

CREATE TABLE hivejobs_gauge (
    name        text NOT NULL,
    queue       text NOT NULL,
    value       bigint NOT NULL,
    measured_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (name, queue)
);
