-- +goose Up
-- A job's kind (internal/job/kind.go, docs/design.md#kinds): what it asks
-- of its model, which decides the provider endpoint and the admission
-- units. Every job stored before kinds existed was a chat completion, so
-- the default fills them without a rewrite of the table; the check is NOT
-- VALID for the same reason (those rows are 'chat' by construction).
ALTER TABLE jobs ADD COLUMN kind text NOT NULL DEFAULT 'chat';
ALTER TABLE jobs ADD CONSTRAINT jobs_kind_check
    CHECK (kind IN ('chat', 'embeddings', 'task', 'audio')) NOT VALID;

-- +goose Down
ALTER TABLE jobs DROP CONSTRAINT jobs_kind_check;
ALTER TABLE jobs DROP COLUMN kind;
