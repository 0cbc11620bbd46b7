-- +goose Up
-- The provider's task id of a task job (docs/design.md#kinds): written
-- once the task is submitted and before it is polled, so a consumer that
-- takes the job over after a crash polls that task instead of submitting
-- (and paying for) another. NULL for every other job.
ALTER TABLE jobs ADD COLUMN task_id text;

-- +goose Down
ALTER TABLE jobs DROP COLUMN task_id;
