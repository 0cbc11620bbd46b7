package store

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/internal/job"
)

// Kinds of dead letter (DeadLetterRow.Kind).
const (
	// DeadLetterJob is the dead letter of a job row (failed at intake, dead
	// after its attempts); one per job. Replay moves the row back to queued.
	DeadLetterJob = "job"
	// DeadLetterMessage is a message that is not a job llmq holds: its id
	// could not be read, or its body conflicts with the stored job of its
	// id. Replay re-publishes it to the intake.
	DeadLetterMessage = "message"
)

// DeadLetterRow is a message llmq gave up on, kept byte for byte.
type DeadLetterRow struct {
	ID int64
	// Kind is DeadLetterJob (the default) or DeadLetterMessage.
	Kind string
	// Tenant is job.DefaultTenant for a malformed message.
	Tenant string
	// JobID is "" when the message had none (malformed).
	JobID string
	// Lane is the priority lane or queue the message came from.
	Lane      string
	Reason    string
	Attempts  int
	LastError string
	// Body is the original message.
	Body          []byte
	FirstFailedAt time.Time
	LastFailedAt  time.Time
	CreatedAt     time.Time
}

const deadLetterColumns = `id, tenant, job_id, lane, reason, attempts, last_error, body,
	first_failed_at, last_failed_at, created_at, kind`

func scanDeadLetter(row pgx.Row) (DeadLetterRow, error) {
	var (
		d                DeadLetterRow
		jobID, lastError *string
	)
	err := row.Scan(&d.ID, &d.Tenant, &jobID, &d.Lane, &d.Reason, &d.Attempts, &lastError, &d.Body,
		&d.FirstFailedAt, &d.LastFailedAt, &d.CreatedAt, &d.Kind)
	if err != nil {
		return DeadLetterRow{}, err
	}
	if jobID != nil {
		d.JobID = *jobID
	}
	if lastError != nil {
		d.LastError = *lastError
	}
	if d.Body == nil {
		d.Body = []byte{}
	}
	d.FirstFailedAt, d.LastFailedAt, d.CreatedAt = d.FirstFailedAt.UTC(), d.LastFailedAt.UTC(), d.CreatedAt.UTC()
	return d, nil
}

func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// RecordDeadLetter stores dl and returns its id. A job that is already in
// the dead-letter table (same tenant and job id, kind job) keeps its row
// and id: the row takes the new reason, attempts, error and body, and
// last_failed_at advances. A message (kind message) always gets a row of
// its own. Zero FirstFailedAt/LastFailedAt mean now.
func (s *Store) RecordDeadLetter(ctx context.Context, dl DeadLetterRow) (int64, error) {
	ctx, stop := s.bound(ctx)
	defer stop()
	return recordDeadLetter(ctx, s.pool, dl)
}

func recordDeadLetter(ctx context.Context, q querier, dl DeadLetterRow) (int64, error) {
	if dl.Tenant == "" {
		dl.Tenant = job.DefaultTenant
	}
	if dl.Body == nil {
		dl.Body = []byte{}
	}
	dl.Reason, dl.LastError = columnText(dl.Reason), columnText(dl.LastError)
	if dl.Kind == "" {
		dl.Kind = DeadLetterJob
		if dl.JobID == "" {
			dl.Kind = DeadLetterMessage
		}
	}
	var first, last *time.Time
	if !dl.FirstFailedAt.IsZero() {
		first = &dl.FirstFailedAt
	}
	if !dl.LastFailedAt.IsZero() {
		last = &dl.LastFailedAt
	}
	onConflict := ``
	if dl.Kind == DeadLetterJob && dl.JobID != "" {
		onConflict = `ON CONFLICT (tenant, job_id) WHERE job_id IS NOT NULL AND kind = 'job' DO UPDATE SET
			lane = excluded.lane, reason = excluded.reason, attempts = excluded.attempts,
			last_error = excluded.last_error, body = excluded.body,
			last_failed_at = greatest(dead_letters.last_failed_at, excluded.last_failed_at)`
	}
	var id int64
	err := q.QueryRow(ctx, `INSERT INTO dead_letters (tenant, job_id, lane, reason, attempts, last_error, body, first_failed_at, last_failed_at, kind)
		VALUES ($1, $2, $3, $4, $5, $6, $7, coalesce($8, now()), coalesce($9, $8, now()), $10)
		`+onConflict+` RETURNING id`,
		dl.Tenant, nullable(dl.JobID), dl.Lane, dl.Reason, dl.Attempts, nullable(dl.LastError), dl.Body, first, last, dl.Kind).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("record dead letter for job %q: %w", dl.JobID, err)
	}
	return id, nil
}

// ListDeadLetters returns one page of the tenant's dead letters, oldest
// first. cursor is "" for the first page or the previous page's next
// cursor; next is "" on the last page. limit 0 means DefaultListLimit.
func (s *Store) ListDeadLetters(ctx context.Context, tenant string, cursor string, limit int) ([]DeadLetterRow, string, error) {
	return s.FindDeadLetters(ctx, DeadLetterFilter{Tenant: tenant, Cursor: cursor, Limit: limit})
}

// DeadLetterFilter selects dead letters: a tenant's, or every tenant's
// (AllTenants, for an admin). Every filter that is set must hold.
type DeadLetterFilter struct {
	Tenant     string
	AllTenants bool
	// Reason, when set, is the reason exactly ("attempts exhausted", …).
	Reason string
	// Model, when set, is the model of the dead letter's job (a message's
	// dead letter, which no job holds, never matches).
	Model string
	// FailedAfter and FailedBefore, when not zero, bound last_failed_at:
	// [FailedAfter, FailedBefore).
	FailedAfter, FailedBefore time.Time
	// Limit is the page size: 0 means DefaultListLimit, at most MaxListLimit.
	Limit int
	// Cursor is the nextCursor of the previous page, "" for the first.
	Cursor string
}

// where is the filter's WHERE clause over dead_letters d (without the
// cursor), its values appended to args.
func (f DeadLetterFilter) where(args *[]any) string {
	param := func(v any) string {
		*args = append(*args, v)
		return "$" + strconv.Itoa(len(*args))
	}
	conds := []string{"true"}
	if !f.AllTenants {
		conds = append(conds, "d.tenant = "+param(f.Tenant))
	}
	if f.Reason != "" {
		conds = append(conds, "d.reason = "+param(f.Reason))
	}
	if f.Model != "" {
		conds = append(conds, "EXISTS (SELECT 1 FROM jobs j WHERE j.tenant = d.tenant AND j.id = d.job_id AND j.model = "+param(f.Model)+")")
	}
	if !f.FailedAfter.IsZero() {
		conds = append(conds, "d.last_failed_at >= "+param(f.FailedAfter))
	}
	if !f.FailedBefore.IsZero() {
		conds = append(conds, "d.last_failed_at < "+param(f.FailedBefore))
	}
	return strings.Join(conds, " AND ")
}

// FindDeadLetters returns one page of the dead letters f selects, oldest
// first (by id). A tenant's are one range of dead_letters_list_idx
// (tenant, id); every tenant's are read in primary-key order.
func (s *Store) FindDeadLetters(ctx context.Context, f DeadLetterFilter) ([]DeadLetterRow, string, error) {
	ctx, stop := s.bound(ctx)
	defer stop()
	limit := pageLimit(f.Limit)
	var after int64
	if f.Cursor != "" {
		var err error
		if after, err = strconv.ParseInt(f.Cursor, 10, 64); err != nil || after < 0 {
			return nil, "", fmt.Errorf("list dead letters: %w", ErrBadCursor)
		}
	}
	args := []any{after, limit + 1}
	rows, err := s.pool.Query(ctx, `SELECT `+qualify("d", deadLetterColumns)+` FROM dead_letters d
		WHERE d.id > $1 AND `+f.where(&args)+` ORDER BY d.id LIMIT $2`, args...)
	if err != nil {
		return nil, "", fmt.Errorf("list dead letters: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (DeadLetterRow, error) { return scanDeadLetter(row) })
	if err != nil {
		return nil, "", fmt.Errorf("list dead letters: %w", err)
	}
	var next string
	if len(out) > limit {
		out = out[:limit]
		next = formatID(out[limit-1].ID)
	}
	return out, next, nil
}

// CountDeadLetters counts the dead letters f selects (its cursor and
// limit aside): what a replay of the filtered set would replay.
func (s *Store) CountDeadLetters(ctx context.Context, f DeadLetterFilter) (int64, error) {
	ctx, stop := s.bound(ctx)
	defer stop()
	var args []any
	var n int64
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM dead_letters d WHERE `+f.where(&args), args...).Scan(&n); err != nil {
		return 0, fmt.Errorf("count dead letters: %w", err)
	}
	return n, nil
}

// qualify prefixes each column of a comma-separated list with alias.
func qualify(alias, columns string) string {
	cols := strings.Split(columns, ",")
	for i, c := range cols {
		cols[i] = alias + "." + strings.TrimSpace(c)
	}
	return strings.Join(cols, ", ")
}

// TakeDeadLetter deletes the tenant's dead letter id and returns it, for
// replay; ErrNotFound if the tenant has no such dead letter. The caller
// re-publishes the body; should that fail, RecordDeadLetter puts it back.
func (s *Store) TakeDeadLetter(ctx context.Context, tenant string, id int64) (DeadLetterRow, error) {
	ctx, stop := s.bound(ctx)
	defer stop()
	d, err := scanDeadLetter(s.pool.QueryRow(ctx, `DELETE FROM dead_letters WHERE tenant = $1 AND id = $2
		RETURNING `+deadLetterColumns, tenant, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return DeadLetterRow{}, fmt.Errorf("take dead letter %d: %w", id, ErrNotFound)
	}
	if err != nil {
		return DeadLetterRow{}, fmt.Errorf("take dead letter %d: %w", id, err)
	}
	return d, nil
}

// GetDeadLetter returns the tenant's dead letter id without removing it;
// ErrNotFound if the tenant has no such dead letter.
func (s *Store) GetDeadLetter(ctx context.Context, tenant string, id int64) (DeadLetterRow, error) {
	ctx, stop := s.bound(ctx)
	defer stop()
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
