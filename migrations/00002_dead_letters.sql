-- +goose Up
-- dead_letters: messages llmq gave up on, kept byte for byte so an operator can
-- inspect and replay them (GET /v1/dlq, POST /v1/dlq/{id}/replay). A malformed
-- message may have no job id; its tenant is then 'default'. One row per job:
-- a job dead-lettered again updates its row.
CREATE TABLE dead_letters (
    id              bigserial   PRIMARY KEY,
    tenant          text        NOT NULL DEFAULT 'default',
    job_id          text,
    lane            text        NOT NULL,
    reason          text        NOT NULL,
    attempts        integer     NOT NULL DEFAULT 0,
    last_error      text,
    body            bytea       NOT NULL,
    first_failed_at timestamptz NOT NULL DEFAULT now(),
    last_failed_at  timestamptz NOT NULL DEFAULT now(),
    created_at      timestamptz NOT NULL DEFAULT now(),

    CONSTRAINT dead_letters_tenant_valid CHECK (tenant <> ''),
    CONSTRAINT dead_letters_reason_valid CHECK (reason <> ''),
    CONSTRAINT dead_letters_attempts_range CHECK (attempts >= 0),
    CONSTRAINT dead_letters_failed_order CHECK (first_failed_at <= last_failed_at)
);

CREATE UNIQUE INDEX dead_letters_job_idx ON dead_letters (tenant, job_id) WHERE job_id IS NOT NULL;
CREATE INDEX dead_letters_list_idx ON dead_letters (tenant, id);

-- +goose Down
DROP TABLE dead_letters;
