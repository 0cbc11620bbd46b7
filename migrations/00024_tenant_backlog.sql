-- +goose Up
-- Backlog per lane and tenant (queued, running, retrying): the back-pressure
-- monitor counts it every second with one GROUP BY priority, tenant, an
-- index-only scan of this partial index (internal/store: TenantBacklog).
-- The index keeps its name and its leading column, so every query that
-- read jobs_backlog_idx by lane (Backlog, Ahead, the reconciler's sweeps)
-- still does, and a status change still adds one backlog-index entry, not
-- two.
DROP INDEX jobs_backlog_idx;
CREATE INDEX jobs_backlog_idx ON jobs (priority, tenant) WHERE status IN ('queued', 'running', 'retrying');

-- +goose Down
DROP INDEX jobs_backlog_idx;
CREATE INDEX jobs_backlog_idx ON jobs (priority) WHERE status IN ('queued', 'running', 'retrying');
