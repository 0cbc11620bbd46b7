-- +goose Up
-- jobs: one row per (tenant, id), written only by internal/store. Every status
-- change is a guarded UPDATE; the CHECK constraints below make a row that
-- contradicts its status impossible even for raw SQL.
CREATE TABLE jobs (
    tenant            text        NOT NULL,
    id                text        NOT NULL,
    model             text        NOT NULL,
    fallback_models   text[]      NOT NULL DEFAULT '{}',
    priority          text        NOT NULL DEFAULT 'normal',
    request           jsonb       NOT NULL,
    metadata          jsonb,
    status            text        NOT NULL DEFAULT 'queued',
    attempts          integer     NOT NULL DEFAULT 0,
    max_attempts      integer     NOT NULL DEFAULT 5,
    model_used        text,
    response          jsonb,
    prompt_tokens     integer,
    completion_tokens integer,
    -- one entry per failed attempt: {attempt, model, kind, code, message, at}
    errors            jsonb       NOT NULL DEFAULT '[]',
    next_attempt_at   timestamptz,
    lease_owner       text,
    lease_expires_at  timestamptz,
    deadline          timestamptz,
    created_at        timestamptz NOT NULL DEFAULT now(),
    started_at        timestamptz,
    completed_at      timestamptz,
    updated_at        timestamptz NOT NULL DEFAULT now(),

    PRIMARY KEY (tenant, id),

    CONSTRAINT jobs_tenant_valid   CHECK (tenant <> '' AND length(tenant) <= 64),
    CONSTRAINT jobs_id_valid       CHECK (id <> '' AND length(id) <= 128),
    CONSTRAINT jobs_priority_valid CHECK (priority IN ('high', 'normal', 'low')),
    CONSTRAINT jobs_status_valid   CHECK (status IN ('queued', 'running', 'retrying', 'succeeded', 'failed', 'dead', 'cancelled')),
    CONSTRAINT jobs_request_object CHECK (jsonb_typeof(request) = 'object'),
    CONSTRAINT jobs_errors_array   CHECK (jsonb_typeof(errors) = 'array'),
    CONSTRAINT jobs_attempts_range CHECK (max_attempts BETWEEN 1 AND 50 AND attempts BETWEEN 0 AND max_attempts),
    CONSTRAINT jobs_tokens_range   CHECK (coalesce(prompt_tokens, 0) >= 0 AND coalesce(completion_tokens, 0) >= 0),

    -- terminal <=> completed_at is set
    CONSTRAINT jobs_completed_at CHECK (
        (status IN ('succeeded', 'failed', 'dead', 'cancelled')) = (completed_at IS NOT NULL)),
    -- a lease exists exactly while running, and a running job has started
    CONSTRAINT jobs_lease CHECK (
        (status = 'running') = (lease_owner IS NOT NULL)
        AND (status = 'running') = (lease_expires_at IS NOT NULL)
        AND (status <> 'running' OR (started_at IS NOT NULL AND attempts >= 1))),
    -- a retry is scheduled exactly while retrying, after a started attempt
    -- (a rate-limited attempt is given back, so attempts may be 0)
    CONSTRAINT jobs_retry CHECK (
        (status = 'retrying') = (next_attempt_at IS NOT NULL)
        AND (status <> 'retrying' OR started_at IS NOT NULL)),
    -- a result is written once, with the job's success, and nowhere else
    CONSTRAINT jobs_result CHECK (
        (status = 'succeeded') = (response IS NOT NULL)
        AND (status <> 'succeeded' OR (model_used IS NOT NULL AND started_at IS NOT NULL AND attempts >= 1)))
);

-- Indexes cost on the hot path: no update is HOT (every status change
-- touches an indexed column), so each claim and each completion adds an
-- entry to every index whose predicate the new row version matches. Keep
-- only what a query needs (see internal/store: List, Backlog, by-key
-- statements on the primary key).
--
-- List by tenant with keyset pagination on (created_at, id): one status is
-- one range of this index; any status is a merge of the seven ranges
-- (List builds a UNION ALL whose Merge Append keeps the order).
CREATE INDEX jobs_list_status_idx ON jobs (tenant, status, created_at, id);
-- Backlog per lane (queued, running, retrying).
CREATE INDEX jobs_backlog_idx ON jobs (priority) WHERE status IN ('queued', 'running', 'retrying');
-- No index on next_attempt_at or lease_expires_at: due retries and expired
-- leases are found by key when the broker redelivers (Claim, Requeue), never
-- by a scan. A sweeper that scans for them would add partial indexes
-- WHERE status = 'retrying' / 'running'.

-- +goose Down
DROP TABLE jobs;
