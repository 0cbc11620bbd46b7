-- +goose Up
-- One record of every job: the row is written when a job enters llmq (the
-- API's commit, or the ingester for a message published to the intake),
-- before any worker sees it, and the broker message is only a wake-up for
-- it. enqueued_at is when a message for the row was last handed to the
-- broker; NULL means llmq knows no message exists (a retry whose publish
-- the broker refused, a DLQ replay between its commit and its publish), and
-- the reconciler publishes one.
ALTER TABLE jobs ADD COLUMN enqueued_at timestamptz;
UPDATE jobs SET enqueued_at = updated_at WHERE status IN ('queued', 'running', 'retrying');

-- The reconciler's precise sweep: rows that need a message. Tiny, since a
-- row is in it only between a failed publish and the sweep that repairs it.
CREATE INDEX jobs_unenqueued_idx ON jobs (priority, created_at)
    WHERE enqueued_at IS NULL AND status IN ('queued', 'retrying');
-- The reconciler's lost-message sweep (queued rows whose message is gone,
-- past-due retries, expired running leases) runs only while a lane has no
-- message waiting, when the unfinished rows are few; it reads them through
-- jobs_backlog_idx (00001) and needs no index of its own, so the hot path
-- pays for none.

-- dead_letters.kind: 'job' is the dead letter of a job row (failed at
-- intake, dead after its attempts; one per job, replay moves the row), and
-- 'message' a message that is not a job llmq holds (unreadable id, or a
-- body that conflicts with the stored job of its id; replay re-publishes it
-- to the intake).
ALTER TABLE dead_letters ADD COLUMN kind text NOT NULL DEFAULT 'job';
ALTER TABLE dead_letters ADD CONSTRAINT dead_letters_kind_valid CHECK (kind IN ('job', 'message'));
UPDATE dead_letters d SET kind = 'message'
    WHERE job_id IS NULL OR NOT EXISTS (SELECT 1 FROM jobs j WHERE j.tenant = d.tenant AND j.id = d.job_id);
DROP INDEX dead_letters_job_idx;
CREATE UNIQUE INDEX dead_letters_job_idx ON dead_letters (tenant, job_id) WHERE job_id IS NOT NULL AND kind = 'job';

-- +goose Down
DROP INDEX dead_letters_job_idx;
CREATE UNIQUE INDEX dead_letters_job_idx ON dead_letters (tenant, job_id) WHERE job_id IS NOT NULL;
ALTER TABLE dead_letters DROP CONSTRAINT dead_letters_kind_valid;
ALTER TABLE dead_letters DROP COLUMN kind;
DROP INDEX jobs_unenqueued_idx;
ALTER TABLE jobs DROP COLUMN enqueued_at;
