package store

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/internal/job"
)

// ExplainList runs EXPLAIN ANALYZE on the statement List runs for f and
// returns the plan's first lines (BenchmarkConsolePages prints them).
func (s *Store) ExplainList(ctx context.Context, f ListFilter, lines int) (string, error) {
	var after listCursor
	if f.Cursor != "" {
		var err error
		if after, err = decodeCursor(f.Cursor); err != nil {
			return "", err
		}
	}
	tenants := []string{f.Tenant}
	if f.AllTenants {
		var err error
		if tenants, err = s.tenants(ctx); err != nil {
			return "", err
		}
	}
	selective := false
	if len(f.Metadata) > 0 {
		var err error
		if selective, err = s.fewMatch(ctx, f, tenants); err != nil {
			return "", err
		}
	}
	q, args := listQuery(f, pageLimit(f.Limit), after, tenants, selective)
	rows, err := s.pool.Query(ctx, `EXPLAIN (ANALYZE, BUFFERS) `+q, args...)
	if err != nil {
		return "", fmt.Errorf("explain: %w", err)
	}
	plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return "", fmt.Errorf("explain: %w", err)
	}
	if len(plan) > lines {
		plan = append(plan[:lines], "  …", plan[len(plan)-2], plan[len(plan)-1])
	}
	return strings.Join(plan, "\n"), nil
}

// Statements whose plans TestKeyedStatementsIgnoreStaleStatistics checks.
var (
	ClaimBatchSQL    = claimBatchSQL
	CompleteBatchSQL = completeBatchSQL
)

var (
	InsertBatchSQL    = insertBatchSQL
	UnparkClaimingSQL = unparkClaimingSQL
	LockParkedSQL     = lockParkedSQL
	UnparkSQL         = unparkSQL
	TakeUnenqueuedSQL = takeUnenqueuedSQL
)

// ResubmittedMany is resubmitted for tests of its snapshots.
func (s *Store) ResubmittedMany(ctx context.Context, keys []job.Key) (map[job.Key]Record, error) {
	return s.resubmitted(ctx, keys)
}

// FromCursor runs take as a take of g's parked jobs, for tests of what
// happens while one is under way.
func FromCursor(s *Store, g ParkedGroup, limit int, take func(*time.Time) ([]Record, error)) ([]Record, error) {
	return s.fromCursor(g, limit, take)
}
