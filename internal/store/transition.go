package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/internal/job"
)

// Result is the outcome of a successful attempt.
type Result struct {
	ModelUsed        string
	Response         json.RawMessage
	PromptTokens     int
	CompletionTokens int
	// Trace is what the worker saw of the attempt, for its log entry.
	Trace Trace
}

// Completion is one item of CompleteBatch: the attempt and its result.
type Completion struct {
	Attempt
	Result Result
}

// owned matches the running attempt a, with a.args() as $1..$4.
const owned = `tenant = $1 AND id = $2 AND lease_owner = $3 AND attempts = $4`

func (a Attempt) args() []any {
	return []any{a.Key.Tenant, a.Key.ID, a.Owner, a.N}
}

const completeSQL = `UPDATE jobs SET status = 'succeeded', model_used = $5, response = $6::jsonb,
		prompt_tokens = $7, completion_tokens = $8, completed_at = now(), finished_xid = pg_current_xact_id(),
		lease_owner = NULL, lease_expires_at = NULL, updated_at = now(), attempt_log = attempt_log || $10::jsonb
	WHERE ` + owned + ` AND status = ANY($9)`

// completeUsageSQL is completeSQL adding the call to usage (usage.go).
const completeUsageSQL = `WITH done AS (` + completeSQL + ` RETURNING tenant, id, model_used, prompt_tokens, completion_tokens),
	` + successUsage + `,
	` + successEvents + `
	SELECT count(*) FROM done`

// successEvents is the CTE that writes the outbox row (result_events) of
// each job of the CTE done (columns tenant, id), which a completion
// statement finished: the statements that set finished_xid themselves do
// the trigger's work for all their rows at once (migration 00036).
const successEvents = `events AS (INSERT INTO result_events (tenant, job_id, status, occurred_at)
		SELECT done.tenant, done.id, 'succeeded', now() FROM done ORDER BY done.tenant, done.id)`

// responseText is r.Response as stored; an empty one becomes JSON null,
// which the jobs_result CHECK refuses (a success needs a response).
func responseText(r Result) string {
	if len(r.Response) == 0 {
		return "null"
	}
	return string(job.ReplaceUnstorableEscapes(r.Response))
}

// Complete stores r as the result of the running attempt a and marks the
// job succeeded. It returns false, changing nothing, when a's claim no
// longer holds (lease taken over, job cancelled, already done).
func (s *Store) Complete(ctx context.Context, a Attempt, r Result) (bool, error) {
	ctx, stop := s.bound(ctx)
	defer stop()
	entry := logEntry(r.Trace.successOf(a, r))
	args := append(a.args(), r.ModelUsed, responseText(r), r.PromptTokens, r.CompletionTokens, guard(job.StatusSucceeded), entry)
	var n int
	if err := s.pool.QueryRow(ctx, completeUsageSQL, args...).Scan(&n); err != nil {
		return false, fmt.Errorf("complete job %s: %w", a.Key.ID, err)
	}
	return n == 1, nil
}

// completeBatchSQL is completeUsageSQL over arrays, the attempt logs and
// the responses last for insertBatchSQL's reason.
var completeBatchSQL = `WITH done AS (UPDATE jobs SET status = 'succeeded', model_used = u.model_used, response = u.response::jsonb,
		prompt_tokens = u.prompt_tokens, completion_tokens = u.completion_tokens, completed_at = now(), finished_xid = pg_current_xact_id(),
		lease_owner = NULL, lease_expires_at = NULL, updated_at = now(), attempt_log = jobs.attempt_log || u.entry::jsonb
	FROM unnest($1::text[], $2::text[], $3::text[], $4::int[], $5::text[], $10::text[], $6::int[], $7::int[], $9::text[])
		AS u(tenant, id, owner, attempt, model_used, response, prompt_tokens, completion_tokens, entry)
	WHERE ` + byKey("u", "jobs.lease_owner = u.owner AND jobs.attempts = u.attempt AND jobs.status = ANY($8)") + `
	RETURNING u.tenant, u.id, u.owner, u.attempt, u.model_used, u.prompt_tokens, u.completion_tokens),
	` + successUsage + `,
	` + successEvents + `
	SELECT tenant, id, owner, attempt FROM done`

// CompleteBatch is Complete for many jobs in one statement; ok[i] reports
// items[i].
func (s *Store) CompleteBatch(ctx context.Context, items []Completion) ([]bool, error) {
	ctx, stop := s.bound(ctx)
	defer stop()
	ok := make([]bool, len(items))
	if len(items) == 0 {
		return ok, nil
	}
	n := len(items)
	index := make(map[Attempt][]int, n)
	tenants, ids, owners, models, responses, entries := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	attempts, prompt, completion := make([]int32, n), make([]int32, n), make([]int32, n)
	// Input in key order, the order ClaimBatch locks rows in, makes a
	// deadlock with a concurrent lease takeover unlikely (the plan usually
	// follows the input); Postgres would abort one side with an error.
	order := keyOrder(n, func(i int) job.Key { return items[i].Key })
	for p, i := range order {
		it := items[i]
		tenants[p], ids[p], owners[p], attempts[p] = it.Key.Tenant, it.Key.ID, it.Owner, int32(it.N)
		models[p], responses[p] = it.Result.ModelUsed, responseText(it.Result)
		prompt[p], completion[p] = int32(it.Result.PromptTokens), int32(it.Result.CompletionTokens)
		entries[p] = logEntry(it.Result.Trace.successOf(it.Attempt, it.Result))
		index[it.Attempt] = append(index[it.Attempt], i)
	}
	rows, err := s.pool.Query(ctx, completeBatchSQL, tenants, ids, owners, attempts, models, prompt, completion,
		guard(job.StatusSucceeded), entries, responses)
	if err != nil {
		return nil, fmt.Errorf("complete batch of %d jobs: %w", n, err)
	}
	var a Attempt
	_, err = pgx.ForEachRow(rows, []any{&a.Key.Tenant, &a.Key.ID, &a.Owner, &a.N}, func() error {
		// A row is written once: only the first of repeated items succeeds.
		if is := index[a]; len(is) > 0 {
			ok[is[0]] = true
			index[a] = nil
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("complete batch of %d jobs: %w", n, err)
	}
	return ok, nil
}

// endAttempt ends the running attempt a with status to, appending e to
// the error history; set adds assignments ($7 onward are extra). When e
// records a provider call, the same statement adds it to usage.
func (s *Store) endAttempt(ctx context.Context, op string, a Attempt,
	to job.Status, e AttemptError, set string, extra ...any) (bool, error) {
	return endAttempt(ctx, s.pool, op, a, to, e, set, extra...)
}

// execQuerier is a pool or a transaction.
type execQuerier interface {
	execer
	querier
}

func endAttempt(ctx context.Context, q execQuerier, op string, a Attempt,
	to job.Status, e AttemptError, set string, extra ...any) (bool, error) {
	if e.At.IsZero() {
		e.At = time.Now()
	}
	// One time, at Postgres's precision, for the entry and its usage hour.
	e.At = e.At.Round(time.Microsecond)
	if e.Attempt == 0 {
		e.Attempt = a.N
	}
	entry, err := errorEntry(a.N, e)
	if err != nil {
		return false, fmt.Errorf("%s job %s: %w", op, a.Key.ID, err)
	}
	logged := logEntry(e.Trace.entryOf(e))
	// The extra assignments' parameters follow a.args(), entry and the
	// guard ($7 onward); the log entry comes after them.
	args := append(append(a.args(), entry, guard(to)), extra...)
	args = append(args, logged)
	update := `UPDATE jobs SET status = '` + string(to) + `', errors = errors || $5::jsonb,
			attempt_log = attempt_log || $` + strconv.Itoa(len(args)) + `::jsonb,
			lease_owner = NULL, lease_expires_at = NULL, updated_at = now()` + set + `
		WHERE ` + owned + ` AND status = ANY($6)`
	used, uargs, call := failedCallUsage(e, len(args)+1)
	if !call {
		tag, err := q.Exec(ctx, update, args...)
		if err != nil {
			return false, fmt.Errorf("%s job %s: %w", op, a.Key.ID, err)
		}
		return tag.RowsAffected() == 1, nil
	}
	var n int
	err = q.QueryRow(ctx, `WITH done AS (`+update+` RETURNING tenant), `+used+` SELECT count(*) FROM done`,
		append(args, uargs...)...).Scan(&n)
	if err != nil {
		return false, fmt.Errorf("%s job %s: %w", op, a.Key.ID, err)
	}
	return n == 1, nil
}

// Fail ends the running attempt a: it records e and marks the job failed
// (a permanent error). It returns false, changing nothing, when a's claim
// no longer holds.
func (s *Store) Fail(ctx context.Context, a Attempt, e AttemptError) (bool, error) {
	ctx, stop := s.bound(ctx)
	defer stop()
	return s.endAttempt(ctx, "fail", a, job.StatusFailed, e, `, completed_at = now()`)
}

// ScheduleRetry ends the running attempt a: it records e and marks the job
// retrying, claimable again from at. It returns false, changing nothing,
// when a's claim no longer holds. Its delayed message is published right
// after, so enqueued_at is set now; a failed publish clears it again
// (MarkUnenqueued).
func (s *Store) ScheduleRetry(ctx context.Context, a Attempt, at time.Time, e AttemptError) (bool, error) {
	ctx, stop := s.bound(ctx)
	defer stop()
	return s.endAttempt(ctx, "schedule retry of", a, job.StatusRetrying, e, `, next_attempt_at = $7, enqueued_at = now()`, at)
}

// DeferRateLimited is ScheduleRetry for an attempt the provider refused
// with a rate limit: the attempt is given back (attempts-1), so being
// throttled does not use up max_attempts. The error entry is kept, so the
// caller can bound how often a job is deferred by counting them.
func (s *Store) DeferRateLimited(ctx context.Context, a Attempt, at time.Time, e AttemptError) (bool, error) {
	ctx, stop := s.bound(ctx)
	defer stop()
	return s.endAttempt(ctx, "defer rate-limited", a, job.StatusRetrying, e,
		`, next_attempt_at = $7, attempts = greatest(attempts - 1, 0), enqueued_at = now()`, at)
}

// MarkDead ends the running attempt a: it records e and marks the job dead
// (attempts exhausted or deadline passed); the caller dead-letters it, or
// calls MarkDeadLettered to do both at once. It returns false, changing
// nothing, when a's claim no longer holds.
func (s *Store) MarkDead(ctx context.Context, a Attempt, e AttemptError) (bool, error) {
	ctx, stop := s.bound(ctx)
	defer stop()
	return s.endAttempt(ctx, "mark dead", a, job.StatusDead, e, `, completed_at = now()`)
}

// MarkDeadLettered is MarkDead together with recording dl as the job's
// dead letter, in one transaction, so a dead job is always listed in the
// DLQ. It returns false, changing nothing, when a's claim no longer holds.
func (s *Store) MarkDeadLettered(ctx context.Context, a Attempt, e AttemptError, dl DeadLetterRow) (bool, error) {
	ctx, stop := s.bound(ctx)
	defer stop()
	var ok bool
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) (err error) {
		ok, err = endAttempt(ctx, tx, "mark dead", a, job.StatusDead, e, `, completed_at = now()`)
		if err != nil || !ok {
			return err
		}
		dl.Kind = DeadLetterJob
		_, err = recordDeadLetter(ctx, tx, dl)
		return err
	})
	if err != nil {
		return false, err
	}
	return ok, nil
}

// Requeue moves a retrying job whose time has come, or a running job whose
// lease expired, back to queued (attempts kept), for a sweeper that
// re-publishes such jobs. It returns false when the job is in neither state.
func (s *Store) Requeue(ctx context.Context, key job.Key) (bool, error) {
	ctx, stop := s.bound(ctx)
	defer stop()
	tag, err := s.pool.Exec(ctx, `UPDATE jobs SET status = 'queued', next_attempt_at = NULL,
			lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
		WHERE tenant = $1 AND id = $2 AND status = ANY($3)
		  AND ((status = 'retrying' AND next_attempt_at <= now())
		    OR (status = 'running' AND lease_expires_at <= now()))`,
		key.Tenant, key.ID, guard(job.StatusQueued))
	if err != nil {
		return false, fmt.Errorf("requeue job %s: %w", key.ID, err)
	}
	return tag.RowsAffected() == 1, nil
}

// Heartbeat extends to now+lease the leases that owner holds on the running
// jobs among keys, and returns how many it extended.
func (s *Store) Heartbeat(ctx context.Context, owner string, keys []job.Key, lease time.Duration) (int, error) {
	ctx, stop := s.bound(ctx)
	defer stop()
	if len(keys) == 0 {
		return 0, nil
	}
	tenants := make([]string, len(keys))
	ids := make([]string, len(keys))
	for p, i := range keyOrder(len(keys), func(i int) job.Key { return keys[i] }) {
		tenants[p], ids[p] = keys[i].Tenant, keys[i].ID
	}
	tag, err := s.pool.Exec(ctx, `UPDATE jobs SET lease_expires_at = now() + $2 * interval '1 microsecond', updated_at = now()
		FROM unnest($3::text[], $4::text[]) AS k(tenant, id)
		WHERE `+byKey("k", "jobs.lease_owner = $1 AND jobs.status = 'running'"),
		owner, leaseMicros(lease), tenants, ids)
	if err != nil {
		return 0, fmt.Errorf("heartbeat %d leases: %w", len(keys), err)
	}
	return int(tag.RowsAffected()), nil
}

// moveOrExplain runs a guarded UPDATE … RETURNING; when it matches no row it
// returns ErrNotFound, or a *job.TransitionError with the current status.
func (s *Store) moveOrExplain(ctx context.Context, key job.Key, to job.Status, sql string, args ...any) (Record, error) {
	rec, err := scanRecord(s.pool.QueryRow(ctx, sql, args...))
	if !errors.Is(err, pgx.ErrNoRows) {
		return rec, err
	}
	cur, err := get(ctx, s.pool, key)
	if err != nil {
		return Record{}, err
	}
	return Record{}, &job.TransitionError{From: cur.Status, To: to}
}

// Cancel moves a queued, retrying or running job to cancelled (a running
// attempt then loses its lease and cannot store a result). It returns
// ErrNotFound, or a *job.TransitionError when the job is already terminal.
func (s *Store) Cancel(ctx context.Context, key job.Key) (Record, error) {
	ctx, stop := s.bound(ctx)
	defer stop()
	// A running attempt ends here (its worker's call is aborted and writes
	// nothing): the log says so.
	rec, err := s.moveOrExplain(ctx, key, job.StatusCancelled, `UPDATE jobs SET status = 'cancelled',
			attempt_log = CASE WHEN status = 'running' THEN attempt_log || `+endedBySQL(OutcomeCancelled, "now()")+` ELSE attempt_log END,
			completed_at = now(), next_attempt_at = NULL, lease_owner = NULL, lease_expires_at = NULL, batched_at = NULL, updated_at = now()
		WHERE tenant = $1 AND id = $2 AND status = ANY($3)
		RETURNING `+jobColumns, key.Tenant, key.ID, guard(job.StatusCancelled))
	if err != nil {
		return Record{}, fmt.Errorf("cancel job %s: %w", key.ID, err)
	}
	return rec, nil
}

// replayStale, before "UPDATE jobs SET " and replayMove, deletes the result
// events of the job that the broker refused and the relay put off
// (attempts > 0), when the replay moves it: sent minutes later, after the
// replay's own finish, such an event would tell its old status last, with
// the row's new data. An event not put off goes out within moments, before
// the replay's run ends, and is kept.
const replayStale = `WITH stale AS (DELETE FROM result_events e
		WHERE e.tenant = $1 AND e.job_id = $2 AND e.attempts > 0
		  AND EXISTS (SELECT 1 FROM jobs j WHERE j.tenant = $1 AND j.id = $2 AND j.status = ANY($3) AND j.status IN ('dead', 'failed')))
	`

// replayMove is the SET…RETURNING of a replay: a dead or failed job ($1
// tenant, $2 id, $3 job.AllowedFrom(queued)) back to queued with attempts
// reset and no message yet. ReplayDeadLetter prefixes assignments of its
// own ($4 onward).
const replayMove = `status = 'queued', attempts = 0,
		completed_at = NULL, started_at = NULL, next_attempt_at = NULL, model_used = NULL,
		prompt_tokens = NULL, completion_tokens = NULL, enqueued_at = NULL, parked_at = NULL, updated_at = now()
	WHERE tenant = $1 AND id = $2 AND status = ANY($3) AND status IN ('dead', 'failed')
	RETURNING ` + jobColumns

// Replay moves a dead or failed job back to queued with attempts reset to
// 0 (max_attempts unchanged, error history kept) and no message yet
// (enqueued_at NULL: the caller publishes one and calls MarkEnqueued, or
// the reconciler does). It returns ErrNotFound, or a *job.TransitionError
// when the job is in another status.
func (s *Store) Replay(ctx context.Context, key job.Key) (Record, error) {
	ctx, stop := s.bound(ctx)
	defer stop()
	rec, err := s.moveOrExplain(ctx, key, job.StatusQueued, replayStale+`UPDATE jobs SET `+replayMove,
		key.Tenant, key.ID, guard(job.StatusQueued))
	if err != nil {
		return Record{}, fmt.Errorf("replay job %s: %w", key.ID, err)
	}
	return rec, nil
}

// keyOrder returns the indexes 0..n-1 sorted by key(i): the order in which
// batch statements lock rows.
func keyOrder(n int, key func(i int) job.Key) []int {
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(x, y int) int {
		a, b := key(x), key(y)
		if c := strings.Compare(a.Tenant, b.Tenant); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return order
}
