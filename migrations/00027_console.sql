-- +goose Up
-- The console's reads (docs/design.md#console).
--
-- attempt_log: every attempt of a job, one entry each, oldest first
-- (store.AttemptLogEntry): the model called, how it ended (succeeded,
-- rate_limited, server, transient, client, cancelled, lease_expired, …), the
-- HTTP status, the error message, when the worker claimed it, when the call
-- started and ended, the tokens. The statement that ends an attempt appends
-- its entry (Complete, CompleteBatch, Fail, ScheduleRetry, DeferRateLimited,
-- MarkDead; Cancel and a lease takeover for an attempt whose worker never
-- ended it), so the timeline costs no statement of its own. It is not the
-- errors column: errors counts failures for the retry policy and usage, and
-- keeps its meaning. A constant default makes this ALTER instant.
ALTER TABLE jobs ADD COLUMN attempt_log jsonb NOT NULL DEFAULT '[]';
ALTER TABLE jobs ADD CONSTRAINT jobs_attempt_log_array CHECK (jsonb_typeof(attempt_log) = 'array');

-- GET /v1/jobs?meta=key:value finds a tenant's jobs by a metadata value
-- (metadata @> {"key": value}). Without this index a value held by few jobs
-- is a scan of all the tenant's jobs (seconds on a million). Partial: a job
-- submitted without metadata, the hot path's common case, adds no entry on
-- any of its updates. jsonb_path_ops: one hashed entry per key/value path,
-- smaller than jsonb_ops, and it serves exactly @>.
CREATE INDEX jobs_metadata_idx ON jobs USING gin (metadata jsonb_path_ops) WHERE metadata IS NOT NULL;

-- GET /v1/jobs?model= reads a tenant's jobs of one model in (created_at,
-- id) order. Through jobs_list_status_idx alone a model the tenant has few
-- or no jobs of is a scan of all the tenant's jobs (seconds on a million,
-- BenchmarkConsolePages); this index makes it one range. Its cost: one
-- more entry on every update of the hot path (no update is HOT), measured
-- in BENCHMARKS.md.
CREATE INDEX jobs_model_idx ON jobs (tenant, model, created_at, id);

-- +goose Down
DROP INDEX jobs_model_idx;
DROP INDEX jobs_metadata_idx;
ALTER TABLE jobs DROP CONSTRAINT jobs_attempt_log_array;
ALTER TABLE jobs DROP COLUMN attempt_log;
