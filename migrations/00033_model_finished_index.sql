-- +goose NO TRANSACTION
-- +goose Up
-- GET /v1/jobs?model= (docs/design.md#console) now reads finished jobs
-- through a partial index: a job adds its one entry when it finishes,
-- instead of one on its insert, its claim and its completion (no update of
-- the hot path is HOT, so every full index takes an entry on each). The
-- unfinished jobs of a model, a tenant's backlog, are read through
-- jobs_list_status_idx with the model as a filter (store.listQuery).
-- CONCURRENTLY: a big table keeps taking writes while it builds.
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_model_finished_idx ON jobs (tenant, model, created_at, id)
    WHERE status IN ('succeeded', 'failed', 'dead', 'cancelled');
DROP INDEX CONCURRENTLY IF EXISTS jobs_model_idx;

-- +goose Down
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_model_idx ON jobs (tenant, model, created_at, id);
DROP INDEX CONCURRENTLY IF EXISTS jobs_model_finished_idx;
