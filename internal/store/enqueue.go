package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/internal/job"
)

// The broker message of a job is a wake-up for its row; these methods keep
// enqueued_at, llmq's record of whether such a message exists, and find the
// rows whose message is missing or lost (internal/reconcile).

// MarkEnqueued records that a message for each of keys was just handed to
// the broker. Only unfinished jobs are touched.
func (s *Store) MarkEnqueued(ctx context.Context, keys []job.Key) error {
	ctx, stop := s.bound(ctx)
	defer stop()
	if len(keys) == 0 {
		return nil
	}
	tenants, ids := keyArrays(keys)
	_, err := s.pool.Exec(ctx, `UPDATE jobs SET enqueued_at = now()
		FROM unnest($1::text[], $2::text[]) AS k(tenant, id)
		WHERE `+byKey("k", "jobs.status IN ('queued', 'running', 'retrying')"),
		tenants, ids)
	if err != nil {
		return fmt.Errorf("mark %d jobs enqueued: %w", len(keys), err)
	}
	return nil
}

// MarkUnenqueued records that no message exists for the job (its publish
// failed), so the reconciler publishes one: at once for a queued job, when
// it is due for a retrying one, and for a running job whose lease expired
// (TakeOrphaned). Other statuses, and a running job under a live lease,
// are not touched.
func (s *Store) MarkUnenqueued(ctx context.Context, key job.Key) error {
	ctx, stop := s.bound(ctx)
	defer stop()
	_, err := s.pool.Exec(ctx, `UPDATE jobs SET enqueued_at = NULL
		WHERE tenant = $1 AND id = $2
		  AND (status IN ('queued', 'retrying') OR (status = 'running' AND lease_expires_at <= now()))`, key.Tenant, key.ID)
	if err != nil {
		return fmt.Errorf("mark job %s unenqueued: %w", key.ID, err)
	}
	return nil
}

// needsMessage holds for a job that needs a message now and has none
// (jobs_unenqueued_idx, migration 00023).
const needsMessage = `enqueued_at IS NULL AND parked_at IS NULL AND status IN ('queued', 'retrying')
	AND (status = 'queued' OR next_attempt_at <= now())`

// Unenqueued returns up to limit jobs that need a message now: queued, or
// retrying and due, with no message (enqueued_at NULL), oldest first.
// Parked jobs (park.go) have no message on purpose and are left out.
func (s *Store) Unenqueued(ctx context.Context, limit int) ([]Record, error) {
	ctx, stop := s.bound(ctx)
	defer stop()
	rows, err := s.pool.Query(ctx, `SELECT `+jobColumns+` FROM jobs
		WHERE `+needsMessage+` ORDER BY created_at LIMIT $1`, limit)
	if err != nil {
		return nil, fmt.Errorf("find jobs without a message: %w", err)
	}
	return collectRecords(rows)
}

// TakeUnenqueued is Unenqueued for the one who publishes the messages: the
// rows it returns are marked enqueued in the same statement, so a job that
// a delivery claimed meanwhile (a handed-back message redelivered) is not
// returned, and two sweeps never take the same row. The caller publishes a
// message for each and calls MarkUnenqueued for any publish that fails.
// It takes lane by lane, the most urgent first, each lane oldest first.
//
// Its status test implies the predicate of jobs_backlog_idx as well as
// that of jobs_unenqueued_idx, and with statistics taken while nothing
// waited the planner believes the backlog index empty and reads the whole
// backlog through it, once a sweep. Only jobs_unenqueued_idx, ordered by
// (priority, created_at), gives a lane's jobs in created_at order, so the
// sweep runs with sorts disabled: the plan that needs none is the one that
// reads only the jobs without a message
// (TestUnenqueuedSweepIgnoresStaleStatistics).
func (s *Store) TakeUnenqueued(ctx context.Context, limit int) ([]Record, error) {
	ctx, stop := s.bound(ctx)
	defer stop()
	var out []Record
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL enable_sort = off"); err != nil {
			return err
		}
		for _, lane := range job.Priorities {
			if len(out) >= limit {
				break
			}
			rows, err := tx.Query(ctx, takeUnenqueuedSQL, limit-len(out), string(lane))
			if err != nil {
				return err
			}
			recs, err := collectRecords(rows)
			if err != nil {
				return err
			}
			out = append(out, recs...)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("take jobs without a message: %w", err)
	}
	return out, nil
}

// takeUnenqueuedSQL takes up to $1 jobs of lane $2 that need a message,
// oldest first, and marks them enqueued.
var takeUnenqueuedSQL = `UPDATE jobs SET enqueued_at = now()
	FROM (SELECT tenant, id FROM jobs WHERE priority = $2 AND ` + needsMessage + `
		ORDER BY created_at LIMIT $1 FOR UPDATE SKIP LOCKED) AS k
	WHERE jobs.tenant = k.tenant AND jobs.id = k.id
	RETURNING ` + qualifiedJobColumns

// TakeOrphaned is TakeUnenqueued for running jobs that have no message
// (taken directly from the intake, InsertClaiming) and whose lease expired:
// their replica died, and nothing else would wake them. Each tenant's
// running jobs are one range of jobs_list_status_idx, found by a loose
// scan of the tenants, so the cost follows the jobs in flight, not the
// table or the backlog; a row another statement holds (a late completion)
// is skipped, never waited for. The returned rows are marked enqueued; the caller
// publishes a message for each (its claim takes the expired lease over)
// and calls MarkUnenqueued for a publish that fails.
func (s *Store) TakeOrphaned(ctx context.Context, limit int) ([]Record, error) {
	ctx, stop := s.bound(ctx)
	defer stop()
	rows, err := s.pool.Query(ctx, tenantsCTE+`
		UPDATE jobs SET enqueued_at = now()
		FROM (SELECT o.tenant, o.id FROM t CROSS JOIN LATERAL (
				SELECT j.tenant, j.id FROM jobs j
				WHERE j.tenant = t.tenant AND j.status = 'running' AND j.enqueued_at IS NULL AND j.lease_expires_at <= now()
				FOR UPDATE SKIP LOCKED) o
			WHERE t.tenant IS NOT NULL LIMIT $1) AS k
		WHERE `+byKey("k", "jobs.status = 'running' AND jobs.enqueued_at IS NULL")+`
		RETURNING `+qualifiedJobColumns, limit)
	if err != nil {
		return nil, fmt.Errorf("take running jobs without a message: %w", err)
	}
	return collectRecords(rows)
}

// Stale returns up to limit unfinished jobs of lane whose message should
// have been consumed more than after ago: queued with a message handed to
// the broker before that, retrying and due since before that, or running
// under a lease that expired before that. Called for a lane with no message
// waiting, such a job's message is lost (a purged queue, a crash between a
// commit and its publish) or was never read.
func (s *Store) Stale(ctx context.Context, lane job.Priority, after time.Duration, limit int) ([]Record, error) {
	ctx, stop := s.bound(ctx)
	defer stop()
	rows, err := s.pool.Query(ctx, `SELECT `+jobColumns+` FROM jobs
		WHERE priority = $1 AND status IN ('queued', 'running', 'retrying') AND CASE status
			WHEN 'queued' THEN enqueued_at < now() - $2 * interval '1 microsecond'
			WHEN 'retrying' THEN enqueued_at IS NOT NULL AND next_attempt_at < now() - $2 * interval '1 microsecond'
			ELSE lease_expires_at < now() - $2 * interval '1 microsecond' END
		ORDER BY created_at LIMIT $3`, string(lane), after.Microseconds(), limit)
	if err != nil {
		return nil, fmt.Errorf("find stale jobs of lane %s: %w", lane, err)
	}
	return collectRecords(rows)
}

// Unconfigured returns up to limit queued jobs whose model is not among
// models (jobs accepted before their model was removed from the config, or
// by a version that did not check).
func (s *Store) Unconfigured(ctx context.Context, models []string, limit int) ([]Record, error) {
	ctx, stop := s.bound(ctx)
	defer stop()
	rows, err := s.pool.Query(ctx, `SELECT `+jobColumns+` FROM jobs
		WHERE status = 'queued' AND NOT (model = ANY($1)) ORDER BY created_at LIMIT $2`, models, limit)
	if err != nil {
		return nil, fmt.Errorf("find jobs of unconfigured models: %w", err)
	}
	return collectRecords(rows)
}

// FailQueued moves a queued job to failed with e, and records dl as its
// dead letter, in one transaction. It returns false, changing nothing,
// when the job is not queued.
func (s *Store) FailQueued(ctx context.Context, key job.Key, e AttemptError, dl DeadLetterRow) (bool, error) {
	ctx, stop := s.bound(ctx)
	defer stop()
	entry, err := errorEntry(0, e)
	if err != nil {
		return false, fmt.Errorf("fail queued job %s: %w", key.ID, err)
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("fail queued job %s: %w", key.ID, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck
	tag, err := tx.Exec(ctx, `UPDATE jobs SET status = 'failed', errors = errors || $3::jsonb,
			completed_at = now(), updated_at = now()
		WHERE tenant = $1 AND id = $2 AND status = 'queued' AND status = ANY($4)`,
		key.Tenant, key.ID, entry, guard(job.StatusFailed))
	if err != nil {
		return false, fmt.Errorf("fail queued job %s: %w", key.ID, err)
	}
	if tag.RowsAffected() == 0 {
		return false, nil
	}
	dl.Kind = DeadLetterJob
	if _, err := recordDeadLetter(ctx, tx, dl); err != nil {
		return false, err
	}
	if err := tx.Commit(ctx); err != nil {
		return false, fmt.Errorf("fail queued job %s: commit: %w", key.ID, err)
	}
	return true, nil
}

// DeadByBroker moves a job whose message the broker dead-lettered (handed
// back past its delivery limit) to dead with e, and records dl as its dead
// letter, in one transaction: from queued or retrying, or from running
// once its lease has expired (a live lease means another delivery of the
// job is being worked on). It returns false, changing nothing, otherwise.
func (s *Store) DeadByBroker(ctx context.Context, key job.Key, e AttemptError, dl DeadLetterRow) (bool, error) {
	ctx, stop := s.bound(ctx)
	defer stop()
	entry, err := errorEntry(0, e)
	if err != nil {
		return false, fmt.Errorf("dead-letter job %s: %w", key.ID, err)
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("dead-letter job %s: %w", key.ID, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck
	var attempts int
	err = tx.QueryRow(ctx, `UPDATE jobs SET status = 'dead', errors = errors || $3::jsonb, completed_at = now(),
			lease_owner = NULL, lease_expires_at = NULL, next_attempt_at = NULL, updated_at = now()
		WHERE tenant = $1 AND id = $2 AND status = ANY($4)
		  AND (status <> 'running' OR lease_expires_at <= now())
		RETURNING attempts`, key.Tenant, key.ID, entry, guard(job.StatusDead)).Scan(&attempts)
	if err != nil {
		if isNoRows(err) {
			return false, nil
		}
		return false, fmt.Errorf("dead-letter job %s: %w", key.ID, err)
	}
	dl.Kind = DeadLetterJob
	dl.Attempts = max(dl.Attempts, attempts)
	if _, err := recordDeadLetter(ctx, tx, dl); err != nil {
		return false, err
	}
	if err := tx.Commit(ctx); err != nil {
		return false, fmt.Errorf("dead-letter job %s: commit: %w", key.ID, err)
	}
	return true, nil
}

// keyArrays returns keys as parameter arrays, in key order: the order in
// which the hot path's batch statements lock rows, so that a statement
// over these arrays and a batch of the worker's do not deadlock.
func keyArrays(keys []job.Key) (tenants, ids []string) {
	tenants, ids = make([]string, len(keys)), make([]string, len(keys))
	for p, i := range keyOrder(len(keys), func(i int) job.Key { return keys[i] }) {
		tenants[p], ids[p] = keys[i].Tenant, keys[i].ID
	}
	return tenants, ids
}
