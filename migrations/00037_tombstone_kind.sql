-- +goose Up
-- kind: the deleted job's kind (chat, embeddings, task, audio). The hash
-- (llmq_job_hash, 00025) does not cover it, so without it a job of another
-- kind reusing a deleted job's id within retention.idempotency would be
-- answered as a re-submission of the deleted one. store.InsertBatch takes a
-- tombstone as the same job only where its kind matches too; the
-- tombstones left before this column (NULL) are compared by hash alone, as
-- they were.
ALTER TABLE job_tombstones ADD COLUMN kind text;

-- +goose Down
ALTER TABLE job_tombstones DROP COLUMN kind;
