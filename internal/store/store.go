package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/llmq/llmq/internal/job"
)

// ErrNotFound reports that no job (or dead letter) has the given key.
var ErrNotFound = errors.New("not found")

// ErrBadCursor reports a pagination cursor this store did not issue.
var ErrBadCursor = errors.New("invalid cursor")

// Store reads and writes jobs and dead letters. It is safe for concurrent use.
type Store struct {
	pool    *pgxpool.Pool
	timeout time.Duration
	// reclaimAt is when LockParked next looks for lost locks (parklock.go),
	// in Unix nanoseconds, shared by the copies WithTimeout makes.
	reclaimAt *atomic.Int64
	// gates keep a group's lock queries of parked jobs and the commits
	// that take its parked rows apart (parkgate.go), shared like reclaimAt.
	gates *parkedGates
	// cursors are where the next lock of a group's parked jobs starts
	// (parkcursor.go), shared like reclaimAt.
	cursors *parkCursors
}

// DefaultTimeout bounds every store call that its caller's context does
// not bound sooner.
const DefaultTimeout = 15 * time.Second

// New returns a Store over pool. The schema must be migrated (Migrate).
// Every call is bounded by DefaultTimeout (WithTimeout changes it).
func New(pool *pgxpool.Pool) *Store {
	return &Store{pool: pool, timeout: DefaultTimeout, reclaimAt: new(atomic.Int64), gates: newParkedGates(), cursors: newParkCursors()}
}

// WithTimeout returns a Store over the same pool whose calls are bounded by
// d instead.
func (s *Store) WithTimeout(d time.Duration) *Store {
	return &Store{pool: s.pool, timeout: d, reclaimAt: s.reclaimAt, gates: s.gates, cursors: s.cursors}
}

// bound gives a store call its deadline: a Postgres that stops answering
// (a partition, a paused proxy, a full disk) fails the call within the
// store's timeout instead of holding the caller, whose messages then go
// back to the broker. The caller's own deadline wins when it is sooner.
func (s *Store) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if s.timeout <= 0 {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, s.timeout)
}

// Record is a job row: the job as submitted plus its processing state.
type Record struct {
	job.Job
	// TaskID is the provider's task id of a task job once it was submitted
	// (tasks.go); "" before and for other kinds.
	TaskID           string
	Status           job.Status
	Attempts         int
	ModelUsed        string
	Response         json.RawMessage
	PromptTokens     int
	CompletionTokens int
	Errors           []AttemptError
	NextAttemptAt    *time.Time
	StartedAt        *time.Time
	CompletedAt      *time.Time
	CreatedAt        time.Time
	UpdatedAt        time.Time
	LeaseOwner       string
	LeaseExpiresAt   *time.Time
	// EnqueuedAt is when a message for the job was last handed to the
	// broker; nil while llmq knows none exists (the reconciler publishes one).
	EnqueuedAt *time.Time
	// BatchID is the batch the job is or was in (internal/offload); nil
	// while it waits to be gathered or never was batched.
	BatchID *int64
}

// AttemptError is one failed attempt in a job's error history.
type AttemptError struct {
	Attempt int       `json:"attempt"`
	Model   string    `json:"model,omitempty"`
	Kind    string    `json:"kind"`
	Code    string    `json:"code,omitempty"`
	Message string    `json:"message"`
	At      time.Time `json:"at"`
	// Call is how the provider answered the attempt when it reached the
	// provider (CallRateLimited, CallFailed); empty for a failure decided
	// without a call (invalid, deadline, exhausted). Usage counts the
	// entries that have one (usage.go).
	Call string `json:"call,omitempty"`
	// Trace is what the worker saw of the attempt, for its entry in the
	// attempt log; it is not part of the error history.
	Trace Trace `json:"-"`
}

// maxErrorMessage bounds one stored error message (bytes).
const maxErrorMessage = 2048

// errorEntry encodes e as a one-element JSON array for `errors || $n`.
func errorEntry(attempt int, e AttemptError) (string, error) {
	if e.Attempt == 0 {
		e.Attempt = attempt
	}
	if e.At.IsZero() {
		e.At = time.Now()
	}
	e.At = e.At.UTC()
	if len(e.Message) > maxErrorMessage {
		e.Message = truncateUTF8(e.Message, maxErrorMessage)
	}
	e.Message, e.Code, e.Model = storableText(e.Message), storableText(e.Code), storableText(e.Model)
	return oneElementArray(e, "attempt error")
}

// oneElementArray encodes [v] for appending to a jsonb array (`col || $n`).
func oneElementArray(v any, what string) (string, error) {
	b, err := json.Marshal([]any{v})
	if err != nil {
		return "", fmt.Errorf("encode %s: %w", what, err)
	}
	return string(b), nil
}

// storableText is s with each NUL character replaced by U+FFFD, the
// replacement character: Postgres refuses NUL in text, and as the escape
// \u0000 in jsonb. Error messages and codes come from providers as they
// answer; one with a NUL would fail the statement that records it.
func storableText(s string) string {
	if strings.IndexByte(s, 0) < 0 {
		return s
	}
	return strings.ReplaceAll(s, "\x00", "\uFFFD")
}

// columnText is storableText for a text column, which also refuses bytes
// that are not UTF-8 (JSON encoding replaces those on its own): each run
// of them becomes one U+FFFD.
func columnText(s string) string {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	return storableText(s)
}

func truncateUTF8(s string, n int) string {
	for n > 0 && n < len(s) && s[n]&0xC0 == 0x80 {
		n--
	}
	return s[:n]
}

// jobColumns is the column list every job query returns, in scanRecord's order.
const jobColumns = `tenant, id, model, fallback_models, priority, request, metadata, status,
	attempts, max_attempts, model_used, response, prompt_tokens, completion_tokens, errors,
	next_attempt_at, lease_owner, lease_expires_at, deadline, created_at, started_at,
	completed_at, updated_at, enqueued_at, reply_to, correlation_id, callback_url, result_topic,
	traceparent, tracestate, kind, task_id, batch_id`

// qualifiedJobColumns is jobColumns for statements that join jobs with
// another relation holding the same column names.
var qualifiedJobColumns = qualify("jobs", jobColumns)

func scanRecord(row pgx.Row, extra ...any) (Record, error) {
	var (
		r                                Record
		priority, status                 string
		request, metadata, resp, errs    []byte
		modelUsed, leaseOwner            *string
		promptTokens, completionTokens   *int32
		replyTo, corrID, callback, topic *string
		traceParent, traceState          *string
		kind                             string
		taskID                           *string
	)
	dest := []any{&r.Tenant, &r.ID, &r.Model, &r.FallbackModels, &priority, &request, &metadata, &status,
		&r.Attempts, &r.MaxAttempts, &modelUsed, &resp, &promptTokens, &completionTokens, &errs,
		&r.NextAttemptAt, &leaseOwner, &r.LeaseExpiresAt, &r.Deadline, &r.CreatedAt, &r.StartedAt,
		&r.CompletedAt, &r.UpdatedAt, &r.EnqueuedAt, &replyTo, &corrID, &callback, &topic,
		&traceParent, &traceState, &kind, &taskID, &r.BatchID}
	if err := row.Scan(append(dest, extra...)...); err != nil {
		return Record{}, err
	}
	r.Priority = job.Priority(priority)
	r.Kind = job.Kind(kind)
	r.TaskID = deref(taskID)
	r.Status = job.Status(status)
	r.Request = request
	if metadata != nil {
		r.Metadata = metadata
	}
	if resp != nil {
		r.Response = resp
	}
	if modelUsed != nil {
		r.ModelUsed = *modelUsed
	}
	if leaseOwner != nil {
		r.LeaseOwner = *leaseOwner
	}
	if promptTokens != nil {
		r.PromptTokens = int(*promptTokens)
	}
	if completionTokens != nil {
		r.CompletionTokens = int(*completionTokens)
	}
	if len(r.FallbackModels) == 0 {
		r.FallbackModels = nil
	}
	r.ReplyTo, r.CorrelationID, r.CallbackURL, r.ResultTopic = deref(replyTo), deref(corrID), deref(callback), deref(topic)
	r.TraceParent, r.TraceState = deref(traceParent), deref(traceState)
	if len(errs) > 0 {
		if err := json.Unmarshal(errs, &r.Errors); err != nil {
			return Record{}, fmt.Errorf("decode errors column: %w", err)
		}
	}
	r.CreatedAt, r.UpdatedAt = r.CreatedAt.UTC(), r.UpdatedAt.UTC()
	for _, t := range []**time.Time{&r.NextAttemptAt, &r.StartedAt, &r.CompletedAt, &r.LeaseExpiresAt, &r.Deadline, &r.EnqueuedAt} {
		if *t != nil {
			u := (*t).UTC()
			*t = &u
		}
	}
	return r, nil
}

// guard returns job.AllowedFrom(to) as the text[] for `status = ANY($n)`.
func guard(to job.Status) []string {
	from := job.AllowedFrom(to)
	out := make([]string, len(from))
	for i, s := range from {
		out[i] = string(s)
	}
	return out
}

// jobArgs are the insert parameters of a job, after the contract's defaults.
type jobArgs struct {
	tenant, id, model string
	kind              string
	fallback          []string
	priority          string
	// the request as the job carries it, not copied (the batch inserts
	// send it as a []json.RawMessage, internal/pgcodec)
	request     json.RawMessage
	metadata    *string
	maxAttempts int
	deadline    *time.Time
	// where the result goes; NULL when unset
	replyTo, correlationID, callbackURL, resultTopic *string
	// the W3C trace context of the job's submission; NULL when none
	traceParent, traceState *string
}

func argsOf(j job.Job) jobArgs {
	j.Normalize()
	a := jobArgs{
		tenant: j.Tenant, id: j.ID, model: j.Model, kind: string(j.Kind), fallback: j.FallbackModels,
		priority: string(j.Priority), request: j.Request,
		maxAttempts: j.MaxAttempts, deadline: j.Deadline,
	}
	if a.fallback == nil {
		a.fallback = []string{}
	}
	if len(j.Metadata) > 0 && string(j.Metadata) != "null" {
		m := string(j.Metadata)
		a.metadata = &m
	}
	a.replyTo, a.correlationID, a.callbackURL, a.resultTopic = nullIfEmpty(j.ReplyTo), nullIfEmpty(j.CorrelationID), nullIfEmpty(j.CallbackURL), nullIfEmpty(j.ResultTopic)
	a.traceParent, a.traceState = nullIfEmpty(j.TraceParent), nullIfEmpty(j.TraceState)
	return a
}

func nullIfEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// insertSQL inserts a queued job if (tenant, id) is free. Its message is
// published right after the commit, so enqueued_at is set now.
const insertSQL = `INSERT INTO jobs (tenant, id, model, fallback_models, priority, request, metadata, max_attempts, deadline, enqueued_at,
		reply_to, correlation_id, callback_url, result_topic, traceparent, tracestate, kind)
	VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7::jsonb, $8, $9, now(), $10, $11, $12, $13, $14, $15, $16)
	ON CONFLICT (tenant, id) DO NOTHING
	RETURNING ` + jobColumns

type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

func insert(ctx context.Context, q querier, j job.Job) (Record, bool, error) {
	a := argsOf(j)
	rec, err := scanRecord(q.QueryRow(ctx, insertSQL, a.tenant, a.id, a.model, a.fallback, a.priority, string(a.request), a.metadata, a.maxAttempts, a.deadline,
		a.replyTo, a.correlationID, a.callbackURL, a.resultTopic, a.traceParent, a.traceState, a.kind))
	if err == nil {
		return rec, true, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return Record{}, false, err
	}
	// The key exists (ON CONFLICT waited for any concurrent inserter to
	// commit), so a fresh statement sees it.
	rec, err = get(ctx, q, job.Key{Tenant: a.tenant, ID: a.id})
	return rec, false, err
}

func get(ctx context.Context, q querier, key job.Key) (Record, error) {
	rec, err := scanRecord(q.QueryRow(ctx, `SELECT `+jobColumns+` FROM jobs WHERE tenant = $1 AND id = $2`, key.Tenant, key.ID))
	if errors.Is(err, pgx.ErrNoRows) {
		return Record{}, ErrNotFound
	}
	return rec, err
}

// Insert stores j as queued unless (tenant, id) exists; then it returns the
// existing row unchanged and created=false. j is normalised (job.Normalize)
// but not validated: validate it first.
func (s *Store) Insert(ctx context.Context, j job.Job) (rec Record, created bool, err error) {
	ctx, stop := s.bound(ctx)
	defer stop()
	rec, created, err = insert(ctx, s.pool, j)
	if err != nil {
		return Record{}, false, fmt.Errorf("insert job %s: %w", j.ID, err)
	}
	return rec, created, nil
}

// Get returns the job with key, or ErrNotFound.
func (s *Store) Get(ctx context.Context, key job.Key) (Record, error) {
	ctx, stop := s.bound(ctx)
	defer stop()
	rec, err := get(ctx, s.pool, key)
	if err != nil {
		return Record{}, fmt.Errorf("get job %s: %w", key.ID, err)
	}
	return rec, nil
}

func collectRecords(rows pgx.Rows) ([]Record, error) {
	defer rows.Close()
	var out []Record
	for rows.Next() {
		rec, err := scanRecord(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, rec)
	}
	return out, rows.Err()
}

func isNoRows(err error) bool { return errors.Is(err, pgx.ErrNoRows) }

// Ping checks that Postgres answers.
func (s *Store) Ping(ctx context.Context) error {
	ctx, stop := s.bound(ctx)
	defer stop()
	if err := s.pool.Ping(ctx); err != nil {
		return fmt.Errorf("ping postgres: %w", err)
	}
	return nil
}
