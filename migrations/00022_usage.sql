-- +goose Up
-- usage_hours: what each tenant used of each model, per UTC hour
-- (docs/design.md#usage). Every provider answer the worker records on a job
-- row adds to it in the same statement or transaction as that record
-- (internal/store/usage.go), so usage and jobs never disagree, even across
-- a crash: a success when its result is stored, a 429 or a failure when its
-- error entry is appended. An answer whose record did not take (the claim
-- was lost meanwhile) counts in neither.
--
-- bucket is the start of the UTC hour: completed_at for a success, the
-- error entry's "at" for a failed call. shard spreads the rows that
-- concurrent writers add to (the writing backend's pid mod 16), so
-- completion batches of one tenant and model do not queue on one row lock;
-- readers sum over shards.
CREATE TABLE usage_hours (
    bucket        timestamptz NOT NULL,
    tenant        text        NOT NULL,
    model         text        NOT NULL,
    shard         smallint    NOT NULL,
    calls         bigint      NOT NULL DEFAULT 0,
    input_tokens  bigint      NOT NULL DEFAULT 0,
    output_tokens bigint      NOT NULL DEFAULT 0,
    rate_limited  bigint      NOT NULL DEFAULT 0,
    failed        bigint      NOT NULL DEFAULT 0,
    PRIMARY KEY (bucket, tenant, model, shard)
);

-- A tenant's usage over a range.
CREATE INDEX usage_hours_tenant_idx ON usage_hours (tenant, bucket);

-- +goose Down
DROP TABLE usage_hours;
