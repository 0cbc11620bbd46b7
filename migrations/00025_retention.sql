-- +goose Up
-- Retention (docs/design.md#retention): the sweeper (internal/retention)
-- deletes finished jobs once their status's retention has passed. A deleted
-- job leaves a tombstone here for retention.idempotency, so that a
-- re-submission of its (tenant, id) is still answered as a duplicate and not
-- run again (store.InsertBatch checks this table).
--
-- hash is sha256 of the job's fields as submitted (llmq_job_hash below):
-- it tells a re-publish of the same job from another job reusing the id.
-- The sweep needs no new index on jobs: it reads expired rows through
-- jobs_list_status_idx (tenant, status, created_at), since a job finished
-- before a cutoff was created before it too.
CREATE TABLE job_tombstones (
    tenant       text        NOT NULL,
    id           text        NOT NULL,
    status       text        NOT NULL,
    hash         bytea       NOT NULL,
    created_at   timestamptz NOT NULL,
    completed_at timestamptz NOT NULL,
    deleted_at   timestamptz NOT NULL,
    PRIMARY KEY (tenant, id)
);
CREATE INDEX job_tombstones_deleted_idx ON job_tombstones (deleted_at);

-- The hash of a job as submitted: its fields in jsonb's canonical text
-- (keys ordered, whitespace and duplicate keys dropped), so two
-- submissions of one job hash alike whatever their JSON spelling. The
-- sweeper hashes a row it deletes, the insert a job it is given.
-- +goose StatementBegin
CREATE FUNCTION llmq_job_hash(model text, fallback_models text[], priority text, max_attempts integer,
        deadline timestamptz, request jsonb, metadata jsonb, reply_to text, correlation_id text,
        callback_url text, result_topic text) RETURNS bytea
    LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT sha256(convert_to(jsonb_build_array(model, to_jsonb(fallback_models), priority, max_attempts,
        extract(epoch FROM deadline), request, metadata, reply_to, correlation_id, callback_url, result_topic)::text, 'UTF8'))
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION llmq_job_hash;
DROP TABLE job_tombstones;
