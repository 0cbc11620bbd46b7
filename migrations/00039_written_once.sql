-- +goose Up
-- A job written once, finished (store.InsertFinished, write-once in
-- docs/design.md), sets finished_xid and writes its outbox row in its own
-- statement, for all its rows at once, as the completions do since
-- 00036: two row triggers per job cost about a quarter of that insert's
-- Postgres CPU (BENCHMARKS.md, "Write-once"). The BEFORE trigger now runs
-- only for a row inserted finished without finished_xid; the AFTER
-- trigger no longer for a row inserted succeeded, which only InsertFinished
-- inserts. The outbox row stays out of BEFORE INSERT: those triggers fire
-- also for rows an ON CONFLICT DO NOTHING then skips.
DROP TRIGGER jobs_finished_xid_insert ON jobs;
CREATE TRIGGER jobs_finished_xid_insert BEFORE INSERT ON jobs
    FOR EACH ROW WHEN (NEW.status IN ('succeeded', 'failed', 'dead', 'cancelled') AND NEW.finished_xid IS NULL)
    EXECUTE FUNCTION llmq_job_finished_xid();
DROP TRIGGER jobs_finished_insert ON jobs;
CREATE TRIGGER jobs_finished_insert AFTER INSERT ON jobs
    FOR EACH ROW WHEN (NEW.status IN ('failed', 'dead', 'cancelled'))
    EXECUTE FUNCTION llmq_job_finished();

-- +goose Down
DROP TRIGGER jobs_finished_xid_insert ON jobs;
CREATE TRIGGER jobs_finished_xid_insert BEFORE INSERT ON jobs
    FOR EACH ROW WHEN (NEW.status IN ('succeeded', 'failed', 'dead', 'cancelled'))
    EXECUTE FUNCTION llmq_job_finished_xid();
DROP TRIGGER jobs_finished_insert ON jobs;
CREATE TRIGGER jobs_finished_insert AFTER INSERT ON jobs
    FOR EACH ROW WHEN (NEW.status IN ('succeeded', 'failed', 'dead', 'cancelled'))
    EXECUTE FUNCTION llmq_job_finished();
