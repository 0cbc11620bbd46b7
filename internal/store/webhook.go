package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/internal/job"
)

// ErrLeaseLost reports that a webhook delivery is no longer held by the
// claim that tries to record it: its lease ran out and another dispatcher
// claimed it, or it was already recorded.
var ErrLeaseLost = errors.New("webhook delivery lease lost")

// maxWebhookError bounds a stored last_error (bytes).
const maxWebhookError = 512

// WebhookDelivery is a claimed webhook delivery: what one attempt sends.
type WebhookDelivery struct {
	ID      int64
	EventID string
	Tenant  string
	JobID   string
	URL     string
	// Payload is the exact body signed and sent on every attempt.
	Payload []byte
	// Attempts is how many attempts were made before this one.
	Attempts  int
	CreatedAt time.Time
	// Lease is the claim's token: the next_attempt_at the claim wrote.
	// Recording the attempt succeeds only while the row still holds it.
	Lease time.Time
	// TraceParent and TraceState are the job's trace context; empty when
	// none.
	TraceParent, TraceState string
}

// WebhookAttempt is the outcome of one failed attempt.
type WebhookAttempt struct {
	// Status is the receiver's HTTP status; 0 when none was received.
	Status int
	// Error says why the attempt failed; it is truncated to 512 bytes.
	Error string
}

// WebhookState is where a job's latest webhook delivery stands.
type WebhookState struct {
	Status        string // pending, delivered, dead
	Attempts      int
	LastError     string
	LastStatus    int
	NextAttemptAt *time.Time
	DeliveredAt   *time.Time
}

// ClaimWebhookDeliveries claims up to limit pending deliveries due at now,
// oldest due first, and pushes each one's next_attempt_at to now+lease:
// a dispatcher that dies mid-send only delays the delivery until the lease
// ends. Rows another dispatcher is claiming are skipped, not waited for.
func (s *Store) ClaimWebhookDeliveries(ctx context.Context, now time.Time, lease time.Duration, limit int) ([]WebhookDelivery, error) {
	ctx, stop := s.bound(ctx)
	defer stop()
	if limit <= 0 {
		return nil, nil
	}
	// Postgres keeps microseconds; the lease must read back exactly.
	until := now.Add(lease).Truncate(time.Microsecond)
	rows, err := s.pool.Query(ctx, `
		UPDATE webhook_deliveries d SET next_attempt_at = $2, updated_at = now()
		FROM (SELECT id FROM webhook_deliveries
		      WHERE status = 'pending' AND next_attempt_at <= $1
		      ORDER BY next_attempt_at LIMIT $3
		      FOR UPDATE SKIP LOCKED) due
		WHERE d.id = due.id
		RETURNING d.id, d.event_id::text, d.tenant, d.job_id, d.url, d.payload, d.attempts, d.created_at, d.next_attempt_at,
			coalesce(d.traceparent, ''), coalesce(d.tracestate, '')`,
		now, until, limit)
	if err != nil {
		return nil, fmt.Errorf("claim webhook deliveries: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (WebhookDelivery, error) {
		var d WebhookDelivery
		err := row.Scan(&d.ID, &d.EventID, &d.Tenant, &d.JobID, &d.URL, &d.Payload, &d.Attempts, &d.CreatedAt, &d.Lease,
			&d.TraceParent, &d.TraceState)
		return d, err
	})
	if err != nil {
		return nil, fmt.Errorf("claim webhook deliveries: %w", err)
	}
	return out, nil
}

// MarkWebhookDelivered records that the claimed delivery d was answered
// with the 2xx status at time at.
func (s *Store) MarkWebhookDelivered(ctx context.Context, d WebhookDelivery, status int, at time.Time) error {
	ctx, stop := s.bound(ctx)
	defer stop()
	tag, err := s.pool.Exec(ctx, `
		UPDATE webhook_deliveries SET status = 'delivered', attempts = attempts + 1,
			last_status = $3, last_error = NULL, next_attempt_at = NULL, delivered_at = $4, updated_at = now()
		WHERE id = $1 AND status = 'pending' AND next_attempt_at = $2`,
		d.ID, d.Lease, status, at)
	return leaseOutcome("mark webhook delivered", tag.RowsAffected(), err)
}

// MarkWebhookRetry records the failed attempt a of the claimed delivery d
// and when to try again.
func (s *Store) MarkWebhookRetry(ctx context.Context, d WebhookDelivery, a WebhookAttempt, next time.Time) error {
	ctx, stop := s.bound(ctx)
	defer stop()
	tag, err := s.pool.Exec(ctx, `
		UPDATE webhook_deliveries SET attempts = attempts + 1,
			last_status = $3, last_error = $4, next_attempt_at = $5, updated_at = now()
		WHERE id = $1 AND status = 'pending' AND next_attempt_at = $2`,
		d.ID, d.Lease, nullIfZero(a.Status), clipError(a.Error), next)
	return leaseOutcome("mark webhook retry", tag.RowsAffected(), err)
}

// MarkWebhookDead records the failed attempt a of the claimed delivery d
// as its last: it is retried no more and stays visible as dead.
func (s *Store) MarkWebhookDead(ctx context.Context, d WebhookDelivery, a WebhookAttempt) error {
	ctx, stop := s.bound(ctx)
	defer stop()
	tag, err := s.pool.Exec(ctx, `
		UPDATE webhook_deliveries SET status = 'dead', attempts = attempts + 1,
			last_status = $3, last_error = $4, next_attempt_at = NULL, updated_at = now()
		WHERE id = $1 AND status = 'pending' AND next_attempt_at = $2`,
		d.ID, d.Lease, nullIfZero(a.Status), clipError(a.Error))
	return leaseOutcome("mark webhook dead", tag.RowsAffected(), err)
}

func leaseOutcome(op string, n int64, err error) error {
	switch {
	case err != nil:
		return fmt.Errorf("%s: %w", op, err)
	case n == 0:
		return fmt.Errorf("%s: %w", op, ErrLeaseLost)
	}
	return nil
}

// clipError bounds a last_error, made storable as every error text the
// store keeps in a column (columnText).
func clipError(s string) string {
	s = columnText(s)
	if len(s) > maxWebhookError {
		s = truncateUTF8(s, maxWebhookError)
	}
	return s
}

func nullIfZero(n int) *int {
	if n == 0 {
		return nil
	}
	return &n
}

// PendingWebhooks counts the deliveries not yet delivered nor dead.
func (s *Store) PendingWebhooks(ctx context.Context) (int64, error) {
	ctx, stop := s.bound(ctx)
	defer stop()
	var n int64
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM webhook_deliveries WHERE status = 'pending'`).Scan(&n); err != nil {
		return 0, fmt.Errorf("count pending webhooks: %w", err)
	}
	return n, nil
}

// WebhookStates returns the state of the latest webhook delivery of each
// job of keys that has one; jobs without a delivery are absent.
func (s *Store) WebhookStates(ctx context.Context, keys []job.Key) (map[job.Key]WebhookState, error) {
	ctx, stop := s.bound(ctx)
	defer stop()
	out := make(map[job.Key]WebhookState, len(keys))
	if len(keys) == 0 {
		return out, nil
	}
	tenants, ids := keyArrays(keys)
	rows, err := s.pool.Query(ctx, `
		SELECT DISTINCT ON (d.tenant, d.job_id) d.tenant, d.job_id, d.status, d.attempts,
			d.last_error, d.last_status, d.next_attempt_at, d.delivered_at
		FROM webhook_deliveries d
		JOIN unnest($1::text[], $2::text[]) AS k(tenant, job_id) ON d.tenant = k.tenant AND d.job_id = k.job_id
		ORDER BY d.tenant, d.job_id, d.id DESC`, tenants, ids)
	if err != nil {
		return nil, fmt.Errorf("webhook states: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			k       job.Key
			st      WebhookState
			lastErr *string
			lastSt  *int32
		)
		if err := rows.Scan(&k.Tenant, &k.ID, &st.Status, &st.Attempts, &lastErr, &lastSt, &st.NextAttemptAt, &st.DeliveredAt); err != nil {
			return nil, fmt.Errorf("webhook states: %w", err)
		}
		if lastErr != nil {
			st.LastError = *lastErr
		}
		if lastSt != nil {
			st.LastStatus = int(*lastSt)
		}
		out[k] = st
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("webhook states: %w", err)
	}
	return out, nil
}
