package store

import (
	"context"
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/internal/job"
)

// MaxGetMany bounds the ids of one GetMany.
const MaxGetMany = 100

// GetMany returns the tenant's jobs among ids, in the order of ids; an id
// with no job of the tenant is simply absent. At most MaxGetMany ids.
func (s *Store) GetMany(ctx context.Context, tenant string, ids []string) ([]Record, error) {
	ctx, stop := s.bound(ctx)
	defer stop()
	if len(ids) > MaxGetMany {
		return nil, fmt.Errorf("get jobs: %d ids, at most %d", len(ids), MaxGetMany)
	}
	keys := make([]job.Key, len(ids))
	for i, id := range ids {
		keys[i] = job.Key{Tenant: tenant, ID: id}
	}
	recs, err := s.getMany(ctx, keys)
	if err != nil {
		return nil, fmt.Errorf("get jobs: %w", err)
	}
	out := make([]Record, 0, len(recs))
	for _, k := range keys {
		if r, ok := recs[k]; ok {
			out = append(out, r)
			delete(recs, k) // an id asked twice is listed once
		}
	}
	return out, nil
}

// FeedFilter selects one page of the feed of a tenant's finished jobs.
type FeedFilter struct {
	Tenant string
	// Statuses restricts the page to these terminal statuses; empty means
	// all four.
	Statuses []job.Status
	// After is the NextCursor of the previous page; "" starts at the
	// beginning.
	After string
	// Limit is the page size: 0 means DefaultListLimit, at most MaxListLimit.
	Limit int
}

// feedCursor is the (finished_xid, id) of the last job handed out.
type feedCursor struct {
	xid uint64
	id  string
}

func (c feedCursor) encode() string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatUint(c.xid, 10) + ":" + c.id))
}

func decodeFeedCursor(s string) (feedCursor, error) {
	if s == "" {
		return feedCursor{}, nil
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return feedCursor{}, ErrBadCursor
	}
	x, id, ok := strings.Cut(string(b), ":")
	xid, err := strconv.ParseUint(x, 10, 64)
	// The cursor of an empty feed is "0:", before every job.
	if !ok || err != nil || (id == "" && xid != 0) {
		return feedCursor{}, ErrBadCursor
	}
	return feedCursor{xid: xid, id: id}, nil
}

// Feed returns the tenant's jobs that finished after the cursor, in the
// order of the transactions that finished them (finished_xid, then id),
// and the cursor to continue from, which is never "": with no new job it
// is the cursor given. A job replayed and finished again is listed again.
//
// A transaction's xid is taken when it first writes, not when it commits,
// so a job finished by an older transaction still running would commit
// behind a cursor already handed out. The feed therefore stops below the
// oldest transaction still running (pg_snapshot_xmin): everything below it
// has committed or aborted, so no later read can find a new row there.
// A long transaction holds the feed back until it ends; it skips nothing.
func (s *Store) Feed(ctx context.Context, f FeedFilter) (recs []Record, nextCursor string, err error) {
	ctx, stop := s.bound(ctx)
	defer stop()
	after, err := decodeFeedCursor(f.After)
	if err != nil {
		return nil, "", fmt.Errorf("job feed: %w", err)
	}
	statuses := make([]string, 0, 4)
	for _, st := range f.Statuses {
		if !st.Terminal() {
			return nil, "", fmt.Errorf("job feed: status %q is not terminal", st)
		}
		statuses = append(statuses, string(st))
	}
	if len(statuses) == 0 {
		for _, st := range job.Statuses {
			if st.Terminal() {
				statuses = append(statuses, string(st))
			}
		}
	}
	limit := pageLimit(f.Limit)
	// The status filter applies after the order: rows of other statuses
	// are read and passed over, and the cursor may only advance past the
	// rows this page returns. The xid travels as text (xid8 has no binary
	// codec in pgx).
	rows, err := s.pool.Query(ctx, `SELECT `+jobColumns+`, finished_xid::text FROM jobs
		WHERE tenant = $1 AND finished_xid IS NOT NULL
		  AND (finished_xid, id) > ($2::text::xid8, $3)
		  AND finished_xid < (`+feedHorizon+`)
		  AND status = ANY($4)
		ORDER BY finished_xid, id LIMIT $5`,
		f.Tenant, strconv.FormatUint(after.xid, 10), after.id, statuses, limit)
	if err != nil {
		return nil, "", fmt.Errorf("job feed: %w", err)
	}
	last := after
	recs, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (Record, error) {
		var xid string
		r, err := scanRecord(row, &xid)
		if err != nil {
			return r, err
		}
		if last.xid, err = strconv.ParseUint(xid, 10, 64); err != nil {
			return r, fmt.Errorf("finished_xid %q: %w", xid, err)
		}
		last.id = r.ID
		return r, nil
	})
	if err != nil {
		return nil, "", fmt.Errorf("job feed: %w", err)
	}
	return recs, last.encode(), nil
}

// feedHorizon is the oldest transaction of this database still running,
// or, with none, the next xid: the feed's exclusive upper bound.
// pg_snapshot_xmin alone is the oldest of the whole cluster, so a long
// transaction in another database (which can never write these jobs)
// would hold every feed back. Only transactions that pg_stat_activity
// shows in another database are left out, so the bound errs on the
// holding-back side: one that ends before the activity is read, a
// prepared transaction, or a session whose xid the role may not see
// still counts.
const feedHorizon = `SELECT least(pg_snapshot_xmax(snap), (
		SELECT min(x) FROM pg_snapshot_xip(snap) AS x
		WHERE NOT EXISTS (SELECT FROM pg_stat_activity a
			WHERE a.backend_xid = xid(x) AND a.datname <> current_database())))
	FROM pg_current_snapshot() AS snap`

// MaxAhead bounds the count of Ahead: past it a job's start is far enough
// off that the exact figure does not matter, and counting costs a heap
// visit per job.
const MaxAhead = 100_000

// Ahead counts the jobs waiting in lane (queued or retrying, of any
// tenant) that were created before the job (createdAt, id), up to
// MaxAhead: the backlog the lane drains before it.
func (s *Store) Ahead(ctx context.Context, lane job.Priority, createdAt time.Time, id string) (int64, error) {
	ctx, stop := s.bound(ctx)
	defer stop()
	var n int64
	// The status list implies jobs_backlog_idx's predicate, so the count
	// reads that index's range of the lane only.
	err := s.pool.QueryRow(ctx, `SELECT count(*) FROM (
		SELECT 1 FROM jobs WHERE priority = $1 AND status IN ('queued', 'retrying')
		  AND (created_at, id) < ($2, $3) LIMIT $4) ahead`,
		string(lane), createdAt, id, MaxAhead).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("jobs ahead: %w", err)
	}
	return n, nil
}
