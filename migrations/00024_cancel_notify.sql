-- +goose Up
-- Cancelling a running job stops its provider call (docs/design.md#lifecycle):
-- the move running -> cancelled, whatever statement makes it, notifies
-- llmq_job_cancelled with '<tenant> <id>', and the consumer that holds the
-- job aborts its call. Only that move notifies: a NOTIFY holds a lock
-- through its commit, so the hot path's moves never do.
-- +goose StatementBegin
CREATE FUNCTION llmq_notify_cancelled() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('llmq_job_cancelled', NEW.tenant || ' ' || NEW.id);
    RETURN NULL;
END $$;
-- +goose StatementEnd

CREATE TRIGGER jobs_cancelled_notify AFTER UPDATE OF status ON jobs
    FOR EACH ROW WHEN (OLD.status = 'running' AND NEW.status = 'cancelled')
    EXECUTE FUNCTION llmq_notify_cancelled();

-- +goose Down
DROP TRIGGER jobs_cancelled_notify ON jobs;
DROP FUNCTION llmq_notify_cancelled();
