-- +goose Up
-- Batch offload (docs/design.md#batch-offload, internal/offload): a job of a
-- batch-enabled model and lane is moved from running to 'batched' and its
-- delivery acked; the coordinator gathers batched jobs into a batch, whose
-- every step (file named, uploaded, submitted, finished, done) is recorded
-- here before the next is taken, so a coordinator killed at any step
-- resumes the same batch and never uploads or submits it twice.
ALTER TABLE jobs DROP CONSTRAINT jobs_status_valid;
ALTER TABLE jobs ADD CONSTRAINT jobs_status_valid
    CHECK (status IN ('queued', 'running', 'retrying', 'batched', 'succeeded', 'failed', 'dead', 'cancelled'));

-- batch_id: the batch the job went through (NULL while it waits to be
-- gathered; kept after it leaves, for the record). batched_at is set
-- exactly while the job is batched.
ALTER TABLE jobs ADD COLUMN batch_id bigint;
ALTER TABLE jobs ADD COLUMN batched_at timestamptz;
ALTER TABLE jobs ADD CONSTRAINT jobs_batched CHECK ((status = 'batched') = (batched_at IS NOT NULL));

CREATE TABLE batches (
    id                bigserial   PRIMARY KEY,
    model             text        NOT NULL,
    -- formed: members assigned, file_name chosen; uploaded: input_file_id
    -- known; submitted: provider_batch_id known; finished: the provider's
    -- final status and file ids known; done: every member's outcome stored.
    state             text        NOT NULL DEFAULT 'formed',
    -- The client-chosen name of the input file: a coordinator that finds
    -- state formed looks the upload up by it before uploading again.
    file_name         text        NOT NULL UNIQUE,
    input_file_id     text,
    provider_batch_id text,
    provider_status   text,
    output_file_id    text,
    error_file_id     text,
    jobs              integer     NOT NULL,
    bytes             bigint      NOT NULL,
    tokens            bigint      NOT NULL,
    window_seconds    integer     NOT NULL,
    created_at        timestamptz NOT NULL DEFAULT now(),
    submitted_at      timestamptz,
    finished_at       timestamptz,
    updated_at        timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT batches_state_valid CHECK (state IN ('formed', 'uploaded', 'submitted', 'finished', 'done')),
    CONSTRAINT batches_uploaded CHECK (state IN ('formed', 'done') OR input_file_id IS NOT NULL),
    CONSTRAINT batches_submitted CHECK (state NOT IN ('submitted', 'finished') OR provider_batch_id IS NOT NULL)
);
CREATE INDEX batches_open_idx ON batches (model, id) WHERE state <> 'done';

-- The coordinator gathers a model's waiting jobs oldest first, and finds a
-- batch's members by batch_id.
CREATE INDEX jobs_batch_waiting_idx ON jobs (model, batched_at) WHERE status = 'batched' AND batch_id IS NULL;
CREATE INDEX jobs_batch_members_idx ON jobs (batch_id) WHERE status = 'batched';
-- Batched jobs whose deadline comes near are sent back online.
CREATE INDEX jobs_batched_deadline_idx ON jobs (model, deadline) WHERE status = 'batched' AND deadline IS NOT NULL;

-- +goose Down
DROP INDEX jobs_batched_deadline_idx;
DROP INDEX jobs_batch_members_idx;
DROP INDEX jobs_batch_waiting_idx;
DROP TABLE batches;
ALTER TABLE jobs DROP CONSTRAINT jobs_batched;
ALTER TABLE jobs DROP COLUMN batched_at;
ALTER TABLE jobs DROP COLUMN batch_id;
ALTER TABLE jobs DROP CONSTRAINT jobs_status_valid;
ALTER TABLE jobs ADD CONSTRAINT jobs_status_valid
    CHECK (status IN ('queued', 'running', 'retrying', 'succeeded', 'failed', 'dead', 'cancelled'));
