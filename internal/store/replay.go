package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/internal/job"
)

// Replayed is the outcome of ReplayDeadLetter.
type Replayed struct {
	// DeadLetter is the dead letter replayed.
	DeadLetter DeadLetterRow
	// Job is the job moved back to queued (kind job); its message is not
	// published yet (EnqueuedAt nil). Nil for a message, and for a job's
	// dead letter whose job no longer exists: the caller replays those as
	// messages.
	Job *Record
}

// ReplayDeadLetter replays the tenant's dead letter id in one transaction.
// For a job's dead letter (kind job) it moves the job from dead or failed
// back to queued with attempts reset, with no message yet, and deletes the
// dead letter: a crash after the commit leaves a queued job whose message
// the reconciler publishes, never a job stranded without one. replacement,
// when not nil, becomes the stored job first (a job that failed at intake
// holds a placeholder; the caller re-parsed its dead letter's body). For a
// message (kind message) it changes nothing: the caller re-publishes the
// body to the intake and then deletes the dead letter (TakeDeadLetter).
//
// Errors: ErrNotFound when the tenant has no such dead letter, a
// *job.TransitionError when its job is in a status replay cannot move.
func (s *Store) ReplayDeadLetter(ctx context.Context, tenant string, id int64, replacement *job.Job) (Replayed, error) {
	ctx, stop := s.bound(ctx)
	defer stop()
	var out Replayed
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		dl, err := scanDeadLetter(tx.QueryRow(ctx, `SELECT `+deadLetterColumns+` FROM dead_letters
			WHERE tenant = $1 AND id = $2 FOR UPDATE`, tenant, id))
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrNotFound
		}
		if err != nil {
			return err
		}
		out.DeadLetter = dl
		if dl.Kind != DeadLetterJob || dl.JobID == "" {
			return nil
		}
		key := job.Key{Tenant: tenant, ID: dl.JobID}
		set := ``
		args := []any{key.Tenant, key.ID, guard(job.StatusQueued)}
		if replacement != nil {
			a := argsOf(*replacement)
			// The row was written from what the refusal could read: the
			// destinations and trace context come from the body now, the
			// reply queue and correlation id also from the message's
			// properties, which the refusal kept.
			set = `model = $4, fallback_models = $5, priority = $6, request = $7::jsonb, metadata = $8::jsonb,
				max_attempts = $9, deadline = $10, kind = $11, callback_url = $12, result_topic = $13,
				traceparent = $14, tracestate = $15, reply_to = coalesce(reply_to, $16), correlation_id = coalesce(correlation_id, $17),`
			args = append(args, a.model, a.fallback, a.priority, string(a.request), a.metadata, a.maxAttempts, a.deadline, a.kind,
				a.callbackURL, a.resultTopic, a.traceParent, a.traceState, a.replyTo, a.correlationID)
		}
		rec, err := scanRecord(tx.QueryRow(ctx, replayStale+`UPDATE jobs SET `+set+replayMove, args...))
		if errors.Is(err, pgx.ErrNoRows) {
			cur, err := get(ctx, tx, key)
			if errors.Is(err, ErrNotFound) {
				return nil // no job holds it: replayed as a message
			}
			if err != nil {
				return err
			}
			return &job.TransitionError{From: cur.Status, To: job.StatusQueued}
		}
		if err != nil {
			return err
		}
		out.Job = &rec
		_, err = tx.Exec(ctx, `DELETE FROM dead_letters WHERE id = $1`, id)
		return err
	})
	if err != nil {
		return Replayed{}, fmt.Errorf("replay dead letter %d: %w", id, err)
	}
	return out, nil
}
