-- hivejobs schema 2: job chains (spincycle's request, job chain, sequences and job log).
-- Never edited once shipped: a schema change is a new file.
--
-- Each try of a chain job is an ordinary hivejobs job (attempts = 1) whose id is
-- '<chain id>:<key>:<total try>'. The coordinator's traverser moves a chain job from pending
-- to running and inserts that try in one transaction, so a try is created at most once.

CREATE TABLE hivejobs_chain (
    id             text PRIMARY KEY,
    name           text NOT NULL,
    args           bytea NOT NULL,
    state          text NOT NULL DEFAULT 'pending' CHECK (state IN (
                       'pending', 'running', 'succeeded', 'failed', 'stopped', 'suspended')),
    stop_requested boolean NOT NULL DEFAULT false,
    -- The traverser looks at the chain again at this time (a retry wait ends, a request).
    wake_at        timestamptz DEFAULT now(),
    jobs           integer NOT NULL,
    suspensions    integer NOT NULL DEFAULT 0,
    created_at     timestamptz NOT NULL DEFAULT now(),
    started_at     timestamptz,
    suspended_at   timestamptz,
    resumed_at     timestamptz,
    finished_at    timestamptz
);

CREATE INDEX hivejobs_chain_created ON hivejobs_chain (created_at);
CREATE INDEX hivejobs_chain_wake ON hivejobs_chain (wake_at)
    WHERE state IN ('pending', 'running', 'suspended');

CREATE TABLE hivejobs_chain_job (
    chain_id     text NOT NULL REFERENCES hivejobs_chain (id) ON DELETE CASCADE,
    key          text NOT NULL,
    name         text NOT NULL,
    payload      bytea NOT NULL,
    priority     smallint NOT NULL,
    delivery     text NOT NULL,
    after_keys   text[] NOT NULL,
    seq          text,           -- key of its sequence's start job, NULL outside sequences
    tries        integer NOT NULL,
    retry_wait_s double precision NOT NULL DEFAULT 0,
    state        text NOT NULL DEFAULT 'pending' CHECK (state IN (
                     'pending', 'running', 'succeeded', 'failed', 'stopped')),
    -- Tries counted against `tries` in the current sequence try; a stopped try is not one.
    try          integer NOT NULL DEFAULT 0,
    -- Every try ever started (stopped ones and earlier sequence tries included): the job-log
    -- try number and the last part of the try's job id.
    total_tries  integer NOT NULL DEFAULT 0,
    job_id       text,           -- the hivejobs job of the current or last try
    not_before   timestamptz,    -- a pending job waits for its retry wait
    started_at   timestamptz,
    finished_at  timestamptz,
    status       text,
    result       bytea,
    error        text,
    PRIMARY KEY (chain_id, key)
);

CREATE INDEX hivejobs_chain_job_running ON hivejobs_chain_job (job_id) WHERE state = 'running';

CREATE TABLE hivejobs_chain_sequence (
    chain_id     text NOT NULL REFERENCES hivejobs_chain (id) ON DELETE CASCADE,
    start_key    text NOT NULL,
    retries      integer NOT NULL,
    retry_wait_s double precision NOT NULL,
    seq_try      integer NOT NULL DEFAULT 1,   -- the sequence try under way (1 = first)
    PRIMARY KEY (chain_id, start_key)
);

-- One row per try of every chain job (spincycle's job log).
CREATE TABLE hivejobs_job_log (
    chain_id    text NOT NULL REFERENCES hivejobs_chain (id) ON DELETE CASCADE,
    key         text NOT NULL,
    try         integer NOT NULL,
    name        text NOT NULL,
    job_id      text NOT NULL,
    seq_try     integer,
    state       text NOT NULL CHECK (state IN ('succeeded', 'failed', 'stopped')),
    started_at  timestamptz,
    finished_at timestamptz NOT NULL,
    error       text,
    PRIMARY KEY (chain_id, key, try)
);

-- Wake the traverser when a try of a chain job finishes, whichever path archived it
-- (completer, rescue, cancel, expiry): one NOTIFY per transaction, delivered on commit.
CREATE FUNCTION hivejobs_chain_try_finished() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM finished f
                 JOIN hivejobs_chain_job cj ON cj.job_id = f.id AND cj.state = 'running') THEN
        PERFORM pg_notify('hivejobs_chain', '');
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER hivejobs_chain_try_finished
    AFTER INSERT ON hivejobs_archive
    REFERENCING NEW TABLE AS finished
    FOR EACH STATEMENT EXECUTE FUNCTION hivejobs_chain_try_finished();
