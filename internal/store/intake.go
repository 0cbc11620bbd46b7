package store

import (
	"bytes"
	"context"
	"fmt"

	"github.com/llmq/llmq/internal/job"
)

// IntakeFailure is a message the ingester refused: malformed, or for a
// model llmq does not serve.
type IntakeFailure struct {
	// Tenant and ID as read from the message; ID is "" when it could not
	// be read (then only a dead letter is kept), Tenant is then the default.
	Tenant, ID string
	// Model as read, or "".
	Model  string
	Lane   job.Priority
	Reason string
	// Body is the message byte for byte.
	Body []byte
	// ReplyTo and CorrelationID, when the message named a reply queue its
	// tenant may use: the failed job's result event goes there.
	ReplyTo, CorrelationID string
}

// IntakeOutcome says what RecordIntakeFailure stored.
type IntakeOutcome int

const (
	// IntakeJobFailed: a job row now holds the id, failed with the reason,
	// with a placeholder request; the body is its dead letter.
	IntakeJobFailed IntakeOutcome = iota + 1
	// IntakeMessageOnly: the id could not be read; a dead letter of kind
	// message holds the body.
	IntakeMessageOnly
	// IntakeConflict: a job already holds the id; the body is a dead
	// letter of kind message, and the job is untouched.
	IntakeConflict
	// IntakeDuplicate: the same failed message was recorded before.
	IntakeDuplicate
)

// placeholderRequest stands in the request column of a job whose message
// could not be parsed: the column holds an object, and nothing runs it.
const placeholderRequest = `{}`

// RecordIntakeFailure stores a refused message so that it is visible: a
// failed job row under its id (GET /v1/jobs/{id} tells the reason) and its
// dead letter (GET /v1/dlq), in one transaction, or only a dead letter when
// the id cannot be read or already names another job.
func (s *Store) RecordIntakeFailure(ctx context.Context, f IntakeFailure) (IntakeOutcome, error) {
	ctx, stop := s.bound(ctx)
	defer stop()
	tenant := f.Tenant
	if tenant == "" {
		tenant = job.DefaultTenant
	}
	lane := f.Lane
	if !lane.Valid() {
		lane = job.PriorityNormal
	}
	dl := DeadLetterRow{Tenant: tenant, JobID: f.ID, Lane: string(lane), Reason: f.Reason, Body: f.Body}
	if f.ID == "" {
		dl.Kind = DeadLetterMessage
		if _, err := s.RecordDeadLetter(ctx, dl); err != nil {
			return 0, err
		}
		return IntakeMessageOnly, nil
	}
	entry, err := errorEntry(0, AttemptError{Kind: "invalid", Model: f.Model, Message: f.Reason})
	if err != nil {
		return 0, fmt.Errorf("record intake failure of job %s: %w", f.ID, err)
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("record intake failure of job %s: %w", f.ID, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck
	tag, err := tx.Exec(ctx, `INSERT INTO jobs (tenant, id, model, priority, request, status, errors, completed_at, reply_to, correlation_id)
		VALUES ($1, $2, $3, $4, $5::jsonb, 'failed', $6::jsonb, now(), $7, $8)
		ON CONFLICT (tenant, id) DO NOTHING`, tenant, f.ID, columnText(f.Model), string(lane), placeholderRequest, entry,
		nullIfEmpty(columnText(f.ReplyTo)), nullIfEmpty(columnText(f.CorrelationID)))
	if err != nil {
		return 0, fmt.Errorf("record intake failure of job %s: %w", f.ID, err)
	}
	outcome := IntakeJobFailed
	if tag.RowsAffected() == 0 {
		var prev []byte
		err := tx.QueryRow(ctx, `SELECT body FROM dead_letters WHERE tenant = $1 AND job_id = $2 AND kind = 'job'`,
			tenant, f.ID).Scan(&prev)
		if err == nil && bytes.Equal(prev, f.Body) {
			return IntakeDuplicate, nil
		}
		if err != nil && !isNoRows(err) {
			return 0, fmt.Errorf("record intake failure of job %s: %w", f.ID, err)
		}
		outcome = IntakeConflict
		dl.Kind = DeadLetterMessage
		dl.Reason = ReasonConflict + ": " + f.Reason
	}
	if _, err := recordDeadLetter(ctx, tx, dl); err != nil {
		return 0, err
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("record intake failure of job %s: commit: %w", f.ID, err)
	}
	return outcome, nil
}

// ReasonConflict is the dead-letter reason of a message that reuses the id
// of a stored job with another body.
const ReasonConflict = "conflicts with the stored job"
