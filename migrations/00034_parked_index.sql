-- +goose NO TRANSACTION
-- +goose Up
-- A parked row is a queued row (docs/design.md#tenants), and now the schema
-- says so: parked_at is cleared whenever a row leaves queued, by whatever
-- statement moves it, and jobs_parked_idx names parked_at alone. Its
-- predicate was "parked_at IS NOT NULL AND status = 'queued'"; a query
-- that had to repeat that status test also implied jobs_backlog_idx's
-- (status IN ('queued', 'running', 'retrying')), and with statistics taken
-- while nothing waited the planner read the whole backlog through it: the
-- intake's parked probe scanned the backlog index up to eight times per
-- insert statement, the unparker once per call (BENCHMARKS.md, "The parked
-- probe"). The probes now test parked_at alone, which only this index
-- serves.
-- +goose StatementBegin
CREATE FUNCTION llmq_job_left_queue() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.parked_at := NULL;
    RETURN NEW;
END $$;
-- +goose StatementEnd

-- WHEN keeps the function to the rare move of a parked row out of queued
-- (a cancel, a claim that finds the deadline passed).
CREATE TRIGGER jobs_left_queue BEFORE UPDATE OF status ON jobs
    FOR EACH ROW WHEN (NEW.parked_at IS NOT NULL AND NEW.status <> 'queued')
    EXECUTE FUNCTION llmq_job_left_queue();

-- Rows that left queued before the trigger existed.
UPDATE jobs SET parked_at = NULL WHERE parked_at IS NOT NULL AND status <> 'queued';

-- NOT VALID, then VALIDATE: the check of existing rows takes no lock that
-- stops writes.
ALTER TABLE jobs ADD CONSTRAINT jobs_parked_queued CHECK (parked_at IS NULL OR status = 'queued') NOT VALID;
ALTER TABLE jobs VALIDATE CONSTRAINT jobs_parked_queued;

CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_parked_rows_idx ON jobs (tenant, model, priority, created_at)
    WHERE parked_at IS NOT NULL;
DROP INDEX CONCURRENTLY IF EXISTS jobs_parked_idx;
ALTER INDEX jobs_parked_rows_idx RENAME TO jobs_parked_idx;

-- +goose Down
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_parked_queued_idx ON jobs (tenant, model, priority, created_at)
    WHERE parked_at IS NOT NULL AND status = 'queued';
DROP INDEX CONCURRENTLY IF EXISTS jobs_parked_idx;
ALTER INDEX jobs_parked_queued_idx RENAME TO jobs_parked_idx;
ALTER TABLE jobs DROP CONSTRAINT jobs_parked_queued;
DROP TRIGGER jobs_left_queue ON jobs;
DROP FUNCTION llmq_job_left_queue();
