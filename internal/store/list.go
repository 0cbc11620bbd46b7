package store

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/internal/job"
)

// DefaultListLimit and MaxListLimit bound one page of List and ListDeadLetters.
const (
	DefaultListLimit = 50
	MaxListLimit     = 1000
)

// ListFilter selects one page of a tenant's jobs.
type ListFilter struct {
	Tenant string
	// Status restricts the page to one status; "" means any.
	Status job.Status
	// Limit is the page size: 0 means DefaultListLimit, at most MaxListLimit.
	Limit int
	// Cursor is the nextCursor of the previous page, "" for the first.
	Cursor string
}

// listCursor is the keyset position after the last row of a page.
type listCursor struct {
	CreatedAt time.Time `json:"t"`
	ID        string    `json:"i"`
}

func encodeCursor(c listCursor) string {
	b, _ := json.Marshal(c) // a time and a string always encode
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodeCursor(s string) (listCursor, error) {
	var c listCursor
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || json.Unmarshal(b, &c) != nil || c.ID == "" {
		return c, ErrBadCursor
	}
	return c, nil
}

func pageLimit(n int) int {
	if n <= 0 {
		return DefaultListLimit
	}
	return min(n, MaxListLimit)
}

// List returns one page of the tenant's jobs, oldest first, with keyset
// pagination on (created_at, id): each row appears once across pages.
// nextCursor is "" on the last page. A cursor this store did not issue
// gives ErrBadCursor.
func (s *Store) List(ctx context.Context, f ListFilter) (recs []Record, nextCursor string, err error) {
	ctx, stop := s.bound(ctx)
	defer stop()
	limit := pageLimit(f.Limit)
	var after listCursor
	hasCursor := f.Cursor != ""
	if hasCursor {
		if after, err = decodeCursor(f.Cursor); err != nil {
			return nil, "", fmt.Errorf("list jobs: %w", err)
		}
	}
	// One status is one range of jobs_list_status_idx (tenant, status,
	// created_at, id). Any status is the same query per status under a
	// UNION ALL: each branch reads its range in order and stops at the
	// limit, and a Merge Append keeps (created_at, id) order, so no second
	// index (tenant, created_at, id) has to be written on every status
	// change. One row more than the page tells whether another page exists.
	args := []any{f.Tenant, limit + 1}
	keyset := ""
	if hasCursor {
		args = append(args, after.CreatedAt, after.ID)
		keyset = " AND (created_at, id) > ($3, $4)"
	}
	branch := func(status string) string {
		return `(SELECT ` + jobColumns + ` FROM jobs WHERE tenant = $1 AND status = ` + status + keyset +
			` ORDER BY created_at, id LIMIT $2)`
	}
	var q string
	if f.Status != "" {
		args = append(args, string(f.Status))
		q = branch(fmt.Sprintf("$%d", len(args)))
	} else {
		parts := make([]string, len(job.Statuses))
		for i, st := range job.Statuses {
			parts[i] = branch("'" + string(st) + "'")
		}
		q = strings.Join(parts, "\nUNION ALL\n") + "\nORDER BY created_at, id LIMIT $2"
	}
	rows, err := s.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, "", fmt.Errorf("list jobs: %w", err)
	}
	recs, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (Record, error) { return scanRecord(row) })
	if err != nil {
		return nil, "", fmt.Errorf("list jobs: %w", err)
	}
	if len(recs) > limit {
		recs = recs[:limit]
		last := recs[limit-1]
		nextCursor = encodeCursor(listCursor{CreatedAt: last.CreatedAt, ID: last.ID})
	}
	return recs, nextCursor, nil
}

// Backlog counts the unfinished jobs (queued, retrying, running) per lane.
// Every lane is present in the map, with 0 when empty.
func (s *Store) Backlog(ctx context.Context) (map[job.Priority]int64, error) {
	ctx, stop := s.bound(ctx)
	defer stop()
	rows, err := s.pool.Query(ctx, `SELECT priority, count(*) FROM jobs
		WHERE status IN ('queued', 'running', 'retrying') GROUP BY priority`)
	if err != nil {
		return nil, fmt.Errorf("backlog: %w", err)
	}
	out := make(map[job.Priority]int64, len(job.Priorities))
	for _, p := range job.Priorities {
		out[p] = 0
	}
	var (
		lane string
		n    int64
	)
	_, err = pgx.ForEachRow(rows, []any{&lane, &n}, func() error {
		out[job.Priority(lane)] = n
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("backlog: %w", err)
	}
	return out, nil
}

func formatID(id int64) string { return strconv.FormatInt(id, 10) }

// DrainRate returns the jobs per second that left the backlog (reached a
// terminal status: succeeded, failed, dead or cancelled) over the last
// window, measured from completed_at.
func (s *Store) DrainRate(ctx context.Context, window time.Duration) (float64, error) {
	ctx, stop := s.bound(ctx)
	defer stop()
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
