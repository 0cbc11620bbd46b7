package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Read-only queries of the producer API (internal/api): drain rate,
// a single dead letter, and a liveness ping.

// DrainRate returns the jobs per second that left the backlog (reached a
// terminal status: succeeded, failed, dead or cancelled) over the last
// window, measured from completed_at.
func (s *Store) DrainRate(ctx context.Context, window time.Duration) (float64, error) {
	if window <= 0 {
		return 0, fmt.Errorf("drain rate: window must be positive, got %s", window)
	}
	var n int64
	err := s.pool.QueryRow(ctx, `SELECT count(*) FROM jobs
		WHERE completed_at > now() - $1 * interval '1 microsecond'`, window.Microseconds()).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("drain rate: %w", err)
	}
	return float64(n) / window.Seconds(), nil
}

// GetDeadLetter returns the tenant's dead letter id without removing it;
// ErrNotFound if the tenant has no such dead letter.
func (s *Store) GetDeadLetter(ctx context.Context, tenant string, id int64) (DeadLetterRow, error) {
	d, err := scanDeadLetter(s.pool.QueryRow(ctx, `SELECT `+deadLetterColumns+` FROM dead_letters
		WHERE tenant = $1 AND id = $2`, tenant, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return DeadLetterRow{}, fmt.Errorf("get dead letter %d: %w", id, ErrNotFound)
	}
	if err != nil {
		return DeadLetterRow{}, fmt.Errorf("get dead letter %d: %w", id, err)
	}
	return d, nil
}

// Ping checks that Postgres answers.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.pool.Ping(ctx); err != nil {
		return fmt.Errorf("ping postgres: %w", err)
	}
	return nil
}
