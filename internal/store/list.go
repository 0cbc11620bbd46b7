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

// ListFilter selects one page of jobs: a tenant's, or every tenant's
// (AllTenants, for an admin). Every filter that is set must hold.
type ListFilter struct {
	Tenant string
	// AllTenants lists every tenant's jobs; Tenant is then ignored.
	AllTenants bool
	// Status restricts the page to one status; "" means any.
	Status job.Status
	// Model, when set, is the model the job asked for.
	Model string
	// Metadata, when not empty, lists JSON objects of which the job's
	// metadata must contain one (metadata @> m; jobs_metadata_idx).
	Metadata []json.RawMessage
	// CreatedAfter and CreatedBefore, when not zero, bound created_at:
	// [CreatedAfter, CreatedBefore).
	CreatedAfter, CreatedBefore time.Time
	// ID, when set, is the job's id: at most one job per tenant.
	ID string
	// Desc lists newest first instead of oldest first.
	Desc bool
	// Limit is the page size: 0 means DefaultListLimit, at most MaxListLimit.
	Limit int
	// Cursor is the nextCursor of the previous page, "" for the first.
	Cursor string
}

// listCursor is the keyset position after the last row of a page, and
// the direction it was read in.
type listCursor struct {
	CreatedAt time.Time `json:"t"`
	ID        string    `json:"i"`
	Desc      bool      `json:"d,omitempty"`
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

// List returns one page of jobs, oldest first (newest first with Desc),
// with keyset pagination on (created_at, id): each row appears once across
// pages. nextCursor is "" on the last page. A cursor this store did not
// issue, or one issued for the other direction, gives ErrBadCursor.
//
// One (tenant, status) is one range of jobs_list_status_idx (tenant,
// status, created_at, id). Several are the same query per pair under a
// UNION ALL: each branch reads its range in order and stops at the limit,
// and a Merge Append keeps (created_at, id) order, so no second index
// (created_at, id) has to be written on every status change of the hot
// path. Every tenant is the tenants the table holds (a loose scan of the
// primary key), so the cost grows with their number: seven branches each.
// The other filters narrow each branch; a metadata value held by few jobs
// is found through jobs_metadata_idx instead. One row more than the page
// tells whether another page exists.
func (s *Store) List(ctx context.Context, f ListFilter) (recs []Record, nextCursor string, err error) {
	ctx, stop := s.bound(ctx)
	defer stop()
	limit := pageLimit(f.Limit)
	var after listCursor
	if f.Cursor != "" {
		if after, err = decodeCursor(f.Cursor); err != nil || after.Desc != f.Desc {
			return nil, "", fmt.Errorf("list jobs: %w", ErrBadCursor)
		}
	}
	tenants := []string{f.Tenant}
	if f.AllTenants {
		if tenants, err = s.tenants(ctx); err != nil {
			return nil, "", fmt.Errorf("list jobs: %w", err)
		}
		if len(tenants) == 0 {
			return nil, "", nil
		}
	}
	selective := false
	if len(f.Metadata) > 0 {
		if selective, err = s.fewMatch(ctx, f, tenants); err != nil {
			return nil, "", fmt.Errorf("list jobs: %w", err)
		}
	}
	q, args := listQuery(f, limit, after, tenants, selective)
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
		nextCursor = encodeCursor(listCursor{CreatedAt: last.CreatedAt, ID: last.ID, Desc: f.Desc})
	}
	return recs, nextCursor, nil
}

// fewMatchRows is the most jobs a metadata filter may select for List to
// read them all through jobs_metadata_idx and sort them.
const fewMatchRows = 2000

// metadataCond is the metadata condition of f: "metadata @> m", which
// jobs_metadata_idx serves, or the same test as a function call, which no
// index serves, for the ordered scans of a value many jobs hold (the
// planner, estimating jsonb containment poorly, would otherwise read
// every match through the index and sort them).
func metadataCond(f ListFilter, param func(any) string, indexed bool) string {
	ors := make([]string, len(f.Metadata))
	for i, m := range f.Metadata {
		if indexed {
			ors[i] = "metadata @> " + param(string(m)) + "::jsonb"
		} else {
			ors[i] = "jsonb_contains(metadata, " + param(string(m)) + "::jsonb)"
		}
	}
	return "(" + strings.Join(ors, " OR ") + ")"
}

// fewMatch reports whether f's metadata filter selects at most
// fewMatchRows of the tenants' jobs: a bounded count through the index.
func (s *Store) fewMatch(ctx context.Context, f ListFilter, tenants []string) (bool, error) {
	var args []any
	param := func(v any) string {
		args = append(args, v)
		return "$" + strconv.Itoa(len(args))
	}
	cond := metadataCond(f, param, true)
	if !f.AllTenants {
		cond += " AND tenant = " + param(f.Tenant)
	}
	var n int
	err := s.pool.QueryRow(ctx, `SELECT count(*) FROM (SELECT 1 FROM jobs WHERE `+cond+
		` LIMIT `+strconv.Itoa(fewMatchRows+1)+`) m`, args...).Scan(&n)
	if err != nil {
		return false, fmt.Errorf("count metadata matches: %w", err)
	}
	return n <= fewMatchRows, nil
}

// listQuery builds List's statement, $1 the row limit, every value a
// parameter. A metadata value few jobs hold (selective) is one query
// through jobs_metadata_idx; a model is, per tenant, one branch for its
// finished jobs over jobs_model_finished_idx (tenant, model, created_at,
// id) and one per unfinished status; anything else one branch per
// (tenant, status) over jobs_list_status_idx.
func listQuery(f ListFilter, limit int, after listCursor, tenants []string, selective bool) (string, []any) {
	args := []any{limit + 1}
	param := func(v any) string {
		args = append(args, v)
		return "$" + strconv.Itoa(len(args))
	}
	order, cmp := "created_at, id", ">"
	if f.Desc {
		order, cmp = "created_at DESC, id DESC", "<"
	}
	var where strings.Builder
	if f.Cursor != "" {
		fmt.Fprintf(&where, " AND (created_at, id) %s (%s, %s)", cmp, param(after.CreatedAt), param(after.ID))
	}
	if f.Model != "" {
		fmt.Fprintf(&where, " AND model = %s", param(f.Model))
	}
	if len(f.Metadata) > 0 {
		where.WriteString(" AND " + metadataCond(f, param, selective))
	}
	if !f.CreatedAfter.IsZero() {
		fmt.Fprintf(&where, " AND created_at >= %s", param(f.CreatedAfter))
	}
	if !f.CreatedBefore.IsZero() {
		fmt.Fprintf(&where, " AND created_at < %s", param(f.CreatedBefore))
	}
	if f.ID != "" {
		fmt.Fprintf(&where, " AND id = %s", param(f.ID))
	}
	conds := statusConds(job.Statuses)
	switch {
	case f.Status != "":
		conds = statusConds([]job.Status{f.Status})
	case f.Model != "":
		conds = modelStatusConds()
	}
	if selective {
		cond := "true"
		if !f.AllTenants {
			cond = "tenant = " + param(f.Tenant)
		}
		if f.Status != "" {
			cond += " AND status = '" + string(f.Status) + "'"
		}
		return `SELECT ` + jobColumns + ` FROM jobs WHERE ` + cond + where.String() + ` ORDER BY ` + order + ` LIMIT $1`, args
	}
	branches := make([]string, 0, len(tenants)*len(conds))
	for _, tenant := range tenants {
		t := param(tenant)
		for _, status := range conds {
			branches = append(branches, `(SELECT `+jobColumns+` FROM jobs WHERE tenant = `+t+` AND `+status+where.String()+
				` ORDER BY `+order+` LIMIT $1)`)
		}
	}
	if len(branches) == 1 {
		return branches[0], args
	}
	return strings.Join(branches, "\nUNION ALL\n") + "\nORDER BY " + order + " LIMIT $1", args
}

// statusConds is one branch condition per status.
func statusConds(statuses []job.Status) []string {
	out := make([]string, len(statuses))
	for i, st := range statuses {
		out[i] = "status = '" + string(st) + "'"
	}
	return out
}

// modelStatusConds are the branches of a model filter without a status:
// the finished jobs in one range of jobs_model_finished_idx, and each
// unfinished status over jobs_list_status_idx with the model as a filter
// (a backlog; the index takes no entry on the hot path's updates). The
// planner uses the partial index only for a condition that implies its
// predicate (migration 00033), the terminal statuses.
func modelStatusConds() []string {
	var finished, out []string
	for _, st := range job.Statuses {
		if st.Terminal() {
			finished = append(finished, "'"+string(st)+"'")
		} else {
			out = append(out, "status = '"+string(st)+"'")
		}
	}
	return append(out, "status IN ("+strings.Join(finished, ", ")+")")
}

// tenantsCTE is t(tenant): the tenants that hold jobs, and a last NULL,
// by a loose index scan of the primary key.
const tenantsCTE = `WITH RECURSIVE t AS (
		(SELECT tenant FROM jobs ORDER BY tenant LIMIT 1)
		UNION ALL
		SELECT (SELECT j.tenant FROM jobs j WHERE j.tenant > t.tenant ORDER BY j.tenant LIMIT 1) FROM t WHERE t.tenant IS NOT NULL)`

// tenants lists the tenants that hold jobs, by a loose index scan of the
// primary key: one probe per tenant, however many jobs each holds.
func (s *Store) tenants(ctx context.Context) ([]string, error) {
	rows, err := s.pool.Query(ctx, tenantsCTE+` SELECT tenant FROM t WHERE tenant IS NOT NULL`)
	if err != nil {
		return nil, fmt.Errorf("list tenants: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("list tenants: %w", err)
	}
	return out, nil
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
