package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/internal/job"
)

// RetentionLockID is the advisory lock that elects the one active retention
// sweeper among consumer replicas (see Store.TryLead).
const RetentionLockID = 0x6c6c6d71_00000004

// expireJobsSQL deletes up to $5 jobs of tenant $1 in status $2 that
// finished before $3, oldest first, and in the same statement leaves their
// tombstones (deleted at $4) and deletes their job dead letters and webhook
// deliveries. It reads the rows through jobs_list_status_idx (tenant,
// status, created_at): a job finished before the cutoff was created before
// it, so the scan touches only rows created before the cutoff, and of
// those it skips only the few that finished after it (jobs that waited or
// ran across the cutoff, replays). No index of its own is needed, so the
// hot path writes none. Rows a worker holds are skipped, not waited for,
// and so is a job whose webhook is still being delivered (a tenant's
// retention may be shorter than webhooks.retry_for): it goes at the first
// sweep after its delivery ends, delivered or dead. A job whose result
// event the relay has not sent yet (an outage of the broker longer than
// the retention) is kept too: deleted, its event would have nothing to
// read and be dropped, and its producer would never hear. That test is
// made on the victims, after the LIMIT: the outbox has no index but its
// sequence, and as a filter of the scan it turned the plan into a sort of
// every expired row once the outbox was large (430 ms against 12 ms a
// batch with 50,000 events pending). A batch with such jobs deletes fewer
// than its limit, which ends the sweep of its tenant and status until the
// next pass.
const expireJobsSQL = `WITH victims AS (
		SELECT tenant, id FROM jobs
		WHERE tenant = $1 AND status = $2 AND created_at < $3 AND completed_at < $3
		  AND NOT EXISTS (SELECT 1 FROM webhook_deliveries w
			WHERE w.tenant = jobs.tenant AND w.job_id = jobs.id AND w.status = 'pending')
		ORDER BY created_at
		LIMIT $5
		FOR UPDATE SKIP LOCKED
	), del AS (
		DELETE FROM jobs j USING victims v
		WHERE j.tenant = v.tenant AND j.id = v.id
		  AND NOT EXISTS (SELECT 1 FROM result_events e WHERE e.tenant = v.tenant AND e.job_id = v.id)
		RETURNING j.tenant, j.id, j.status, j.kind, j.created_at, j.completed_at,
			llmq_job_hash(j.model, j.fallback_models, j.priority, j.max_attempts, j.deadline, j.request, j.metadata,
				j.reply_to, j.correlation_id, j.callback_url, j.result_topic) AS hash
	), tomb AS (
		INSERT INTO job_tombstones (tenant, id, status, kind, hash, created_at, completed_at, deleted_at)
		SELECT tenant, id, status, kind, hash, created_at, completed_at, $4 FROM del
		ON CONFLICT (tenant, id) DO UPDATE SET status = EXCLUDED.status, kind = EXCLUDED.kind, hash = EXCLUDED.hash,
			created_at = EXCLUDED.created_at, completed_at = EXCLUDED.completed_at, deleted_at = EXCLUDED.deleted_at
	), dls AS (
		DELETE FROM dead_letters d USING del
		WHERE d.kind = 'job' AND d.tenant = del.tenant AND d.job_id = del.id
	), hooks AS (
		DELETE FROM webhook_deliveries w USING del
		WHERE w.tenant = del.tenant AND w.job_id = del.id
	)
	SELECT count(*) FROM del`

// ExpireJobs deletes up to limit jobs of tenant in the finished status st
// whose completed_at is before cutoff, with their job dead letters and
// webhook deliveries, and keeps a tombstone of each (deleted_at = now) so
// that InsertBatch still answers a re-submission as a duplicate. It
// returns how many jobs it deleted; fewer than limit means none is left.
func (s *Store) ExpireJobs(ctx context.Context, tenant string, st job.Status, cutoff, now time.Time, limit int) (int, error) {
	var n int
	if err := s.pool.QueryRow(ctx, expireJobsSQL, tenant, string(st), cutoff, now, limit).Scan(&n); err != nil {
		return 0, fmt.Errorf("expire %s jobs of tenant %s: %w", st, tenant, err)
	}
	return n, nil
}

// JobTenants lists the tenants that have jobs, by a loose scan of the
// primary key: one index probe per tenant, not a scan of the table.
func (s *Store) JobTenants(ctx context.Context) ([]string, error) {
	rows, err := s.pool.Query(ctx, `WITH RECURSIVE t(tenant) AS (
			(SELECT tenant FROM jobs ORDER BY tenant LIMIT 1)
			UNION ALL
			SELECT (SELECT j.tenant FROM jobs j WHERE j.tenant > t.tenant ORDER BY j.tenant LIMIT 1)
			FROM t WHERE t.tenant IS NOT NULL)
		SELECT tenant FROM t WHERE tenant IS NOT NULL`)
	if err != nil {
		return nil, fmt.Errorf("job tenants: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("job tenants: %w", err)
	}
	return out, nil
}

// ExpireMessageDeadLetters deletes up to limit dead letters of messages
// (kind 'message': no job row holds them) recorded before cutoff.
func (s *Store) ExpireMessageDeadLetters(ctx context.Context, cutoff time.Time, limit int) (int, error) {
	return s.expire(ctx, "message dead letters", `DELETE FROM dead_letters WHERE id IN (
		SELECT id FROM dead_letters WHERE kind = 'message' AND created_at < $1 ORDER BY id LIMIT $2)`, cutoff, limit)
}

// ExpireTombstones deletes up to limit tombstones of jobs deleted before
// cutoff: their ids may be used again for new jobs.
func (s *Store) ExpireTombstones(ctx context.Context, cutoff time.Time, limit int) (int, error) {
	return s.expire(ctx, "tombstones", `DELETE FROM job_tombstones WHERE (tenant, id) IN (
		SELECT tenant, id FROM job_tombstones WHERE deleted_at < $1 ORDER BY deleted_at LIMIT $2)`, cutoff, limit)
}

// ExpireUsage deletes up to limit usage_hours rows of hours that started
// before cutoff.
func (s *Store) ExpireUsage(ctx context.Context, cutoff time.Time, limit int) (int, error) {
	return s.expire(ctx, "usage", `DELETE FROM usage_hours WHERE (bucket, tenant, model, shard) IN (
		SELECT bucket, tenant, model, shard FROM usage_hours WHERE bucket < $1 ORDER BY bucket LIMIT $2)`, cutoff, limit)
}

// ExpireBatches deletes up to limit records of provider batches that were
// done (every member's outcome stored) before cutoff. Nothing reads a done
// batch's row (the coordinator resumes only open ones); a job keeps its
// batch_id as a plain number.
func (s *Store) ExpireBatches(ctx context.Context, cutoff time.Time, limit int) (int, error) {
	return s.expire(ctx, "batches", `DELETE FROM batches WHERE id IN (
		SELECT id FROM batches WHERE state = 'done' AND updated_at < $1 ORDER BY id LIMIT $2)`, cutoff, limit)
}

func (s *Store) expire(ctx context.Context, what, sql string, cutoff time.Time, limit int) (int, error) {
	tag, err := s.pool.Exec(ctx, sql, cutoff, limit)
	if err != nil {
		return 0, fmt.Errorf("expire %s: %w", what, err)
	}
	return int(tag.RowsAffected()), nil
}

// tombstoneRecords answers the keys of jobs (of the batch c) that no row
// holds but a tombstone does: the job was run and deleted by retention.
// When the tombstone's hash and kind match the job as given now (a
// tombstone left before it kept the kind is matched by hash), the Record is
// that job with the status it ended in (a re-publish of the same job);
// otherwise it holds only the key and status, so that callers comparing
// content (the ingester) see another job reusing the id.
func (s *Store) tombstoneRecords(ctx context.Context, c *batchColumns, keys []job.Key, jobs []job.Job) (map[job.Key]Record, error) {
	n := len(keys)
	var (
		tenants, ids, models, fallbacks, priorities                = make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		requests                                                   = make([]json.RawMessage, n)
		kinds                                                      = make([]string, n)
		metadata, replyTo, correlationID, callbackURL, resultTopic = make([]*string, n), make([]*string, n), make([]*string, n), make([]*string, n), make([]*string, n)
		maxAttempts                                                = make([]int32, n)
		deadlines                                                  = make([]*time.Time, n)
	)
	for k, key := range keys {
		i := c.first[key]
		a := c.args[i]
		tenants[k], ids[k], models[k], priorities[k], requests[k], kinds[k] = a.tenant, a.id, a.model, a.priority, a.request, a.kind
		fb, _ := json.Marshal(a.fallback)
		fallbacks[k], metadata[k], maxAttempts[k], deadlines[k] = string(fb), a.metadata, int32(a.maxAttempts), a.deadline
		replyTo[k], correlationID[k], callbackURL[k], resultTopic[k] = a.replyTo, a.correlationID, a.callbackURL, a.resultTopic
	}
	rows, err := s.pool.Query(ctx, `SELECT t.tenant, t.id, t.status, t.created_at, t.completed_at,
			t.hash = llmq_job_hash(u.model, ARRAY(SELECT jsonb_array_elements_text(u.fallback)), u.priority, u.max_attempts,
				u.deadline, u.request::jsonb, u.metadata::jsonb, u.reply_to, u.correlation_id, u.callback_url, u.result_topic)
			AND (t.kind IS NULL OR t.kind = u.kind)
		FROM unnest($1::text[], $2::text[], $3::text[], $4::jsonb[], $5::text[], $6::text[], $7::text[],
			$8::int[], $9::timestamptz[], $10::text[], $11::text[], $12::text[], $13::text[], $14::text[])
			AS u(tenant, id, model, fallback, priority, request, metadata, max_attempts, deadline,
				reply_to, correlation_id, callback_url, result_topic, kind)
		JOIN job_tombstones t ON t.tenant = u.tenant AND t.id = u.id`,
		tenants, ids, models, fallbacks, priorities, requests, metadata, maxAttempts, deadlines, replyTo, correlationID, callbackURL, resultTopic, kinds)
	if err != nil {
		return nil, err
	}
	out := map[job.Key]Record{}
	var (
		key                    job.Key
		status                 string
		createdAt, completedAt time.Time
		same                   bool
	)
	_, err = pgx.ForEachRow(rows, []any{&key.Tenant, &key.ID, &status, &createdAt, &completedAt, &same}, func() error {
		i := c.first[key]
		done := completedAt.UTC()
		rec := Record{Job: job.Job{Tenant: key.Tenant, ID: key.ID}, Errors: []AttemptError{}, CreatedAt: createdAt.UTC(), UpdatedAt: done}
		if same {
			rec = insertedRecord(jobs[i], c.args[i], createdAt, done)
		}
		rec.Status, rec.CompletedAt = job.Status(status), &done
		out[key] = rec
		return nil
	})
	return out, err
}
