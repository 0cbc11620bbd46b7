package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/internal/job"
)

// Batch offload, the jobs' side (migrations/00031_batches.sql,
// docs/design.md#batch-offload): a running attempt becomes batched, and a
// batched job leaves with its line's result (succeeded, exactly as an
// online result: events, webhooks and usage through the same triggers and
// CTE) or back online (retrying, due now, its message published next).
// Every statement here is guarded by status = 'batched', so a line stored
// twice, or a job cancelled meanwhile, changes nothing.

// MarkBatched ends the running attempt a by offloading the job: batched,
// waiting to be gathered into a batch, with no lease and no message (the
// caller acks its delivery next). The attempt counts as the batch's. It
// returns false, changing nothing, when a's claim no longer holds.
func (s *Store) MarkBatched(ctx context.Context, a Attempt) (bool, error) {
	ctx, stop := s.bound(ctx)
	defer stop()
	tag, err := s.pool.Exec(ctx, `UPDATE jobs SET status = 'batched', batched_at = now(), batch_id = NULL,
			lease_owner = NULL, lease_expires_at = NULL, enqueued_at = NULL, updated_at = now()
		WHERE `+owned+` AND status = ANY($5)`, append(a.args(), guard(job.StatusBatched))...)
	if err != nil {
		return false, fmt.Errorf("mark job %s batched: %w", a.Key.ID, err)
	}
	return tag.RowsAffected() == 1, nil
}

// BatchedResult is one batch line's successful result.
type BatchedResult struct {
	Key    job.Key
	Result Result
}

// BatchUsageSuffix marks the usage of calls made in a batch: they are
// counted under "<model>@batch", which GET /v1/usage prices at the model's
// price less its batch discount.
const BatchUsageSuffix = "@batch"

// completeBatchedSQL is completeBatchSQL for batched jobs of batch $1; the
// usage is counted under the model's batch name.
const completeBatchedSQL = `WITH done AS (UPDATE jobs SET status = 'succeeded', model_used = u.model_used, response = u.response::jsonb,
		prompt_tokens = u.prompt_tokens, completion_tokens = u.completion_tokens, completed_at = now(),
		finished_xid = pg_current_xact_id(), batched_at = NULL, updated_at = now(),
		attempt_log = jobs.attempt_log || jsonb_build_array(jsonb_build_object('attempt', jobs.attempts, 'model', u.model_used,
			'outcome', 'succeeded', 'kind', 'batch', 'prompt_tokens', u.prompt_tokens, 'completion_tokens', u.completion_tokens,
			'ended_at', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')))
	FROM unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::int[], $7::int[])
		AS u(tenant, id, model_used, response, prompt_tokens, completion_tokens)
	WHERE jobs.tenant = u.tenant AND jobs.id = u.id AND jobs.batch_id = $1 AND jobs.status = 'batched'
	RETURNING jobs.tenant, jobs.id, jobs.model_used || '` + BatchUsageSuffix + `' AS model_used, jobs.prompt_tokens, jobs.completion_tokens),
	` + successUsage + `,
	` + successEvents + `
	SELECT tenant, id FROM done`

// CompleteBatched stores each result as its job's, for the jobs of batch
// that are still batched, and returns per item whether it did. Keys must be
// distinct.
func (s *Store) CompleteBatched(ctx context.Context, batch int64, items []BatchedResult) ([]bool, error) {
	ctx, stop := s.bound(ctx)
	defer stop()
	if len(items) == 0 {
		return nil, nil
	}
	n := len(items)
	keys := make([]job.Key, n)
	tenants, ids, models, responses := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	prompt, completion := make([]int32, n), make([]int32, n)
	for p, i := range keyOrder(n, func(i int) job.Key { return items[i].Key }) {
		it := items[i]
		keys[i] = it.Key
		tenants[p], ids[p], models[p], responses[p] = it.Key.Tenant, it.Key.ID, it.Result.ModelUsed, responseText(it.Result)
		prompt[p], completion[p] = int32(it.Result.PromptTokens), int32(it.Result.CompletionTokens)
	}
	rows, err := s.pool.Query(ctx, completeBatchedSQL, batch, tenants, ids, models, responses, prompt, completion)
	if err != nil {
		return nil, fmt.Errorf("store %d results of batch %d: %w", n, batch, err)
	}
	ok, err := keysReturned(keys, rows)
	if err != nil {
		return nil, fmt.Errorf("store %d results of batch %d: %w", n, batch, err)
	}
	return ok, nil
}

// Unbatch is one batched job sent back online.
type Unbatch struct {
	Key job.Key
	// Error is recorded in the job's errors, with kind "batch" (which
	// keeps it from being offloaded again).
	Error AttemptError
	// GiveBack returns the attempt: nothing ran (the batch expired or was
	// cancelled, the deadline came near), as a rate-limited attempt is.
	GiveBack bool
}

// KindBatch is the kind of the errors of jobs a batch sent back online.
const KindBatch = "batch"

// Unbatched is a job Unbatch moved back online, for its wake-up message.
type Unbatched struct {
	Key   job.Key
	Model string
	Lane  job.Priority
}

// SendOnline moves each batched job of items back online: retrying, due
// now, with its message about to be published (enqueued_at set; a failed
// publish is handed to the reconciler with MarkUnenqueued). The worker
// then runs it as any other retry, under the usual rules (attempts,
// deadline, dead letters). Jobs no longer batched are left alone.
func (s *Store) SendOnline(ctx context.Context, items []Unbatch) ([]Unbatched, error) {
	ctx, stop := s.bound(ctx)
	defer stop()
	if len(items) == 0 {
		return nil, nil
	}
	n := len(items)
	tenants, ids, entries := make([]string, n), make([]string, n), make([]string, n)
	back := make([]int32, n)
	for p, i := range keyOrder(n, func(i int) job.Key { return items[i].Key }) {
		it := items[i]
		e := it.Error
		e.Kind = KindBatch
		entry, err := errorEntry(0, e)
		if err != nil {
			return nil, fmt.Errorf("send %d batched jobs online: %w", n, err)
		}
		tenants[p], ids[p], entries[p] = it.Key.Tenant, it.Key.ID, entry
		if it.GiveBack {
			back[p] = 1
		}
	}
	rows, err := s.pool.Query(ctx, `UPDATE jobs SET status = 'retrying', next_attempt_at = now(), enqueued_at = now(),
			batched_at = NULL, attempts = greatest(jobs.attempts - u.back, 0), updated_at = now(),
			errors = jobs.errors || jsonb_set(u.entry::jsonb, '{0,attempt}', to_jsonb(jobs.attempts))
		FROM unnest($1::text[], $2::text[], $3::text[], $4::int[]) AS u(tenant, id, entry, back)
		WHERE jobs.tenant = u.tenant AND jobs.id = u.id AND jobs.status = 'batched' AND jobs.status = ANY($5)
		RETURNING jobs.tenant, jobs.id, jobs.model, jobs.priority`, tenants, ids, entries, back, guard(job.StatusRetrying))
	if err != nil {
		return nil, fmt.Errorf("send %d batched jobs online: %w", n, err)
	}
	var out []Unbatched
	var u Unbatched
	var lane string
	_, err = pgx.ForEachRow(rows, []any{&u.Key.Tenant, &u.Key.ID, &u.Model, &lane}, func() error {
		u.Lane = job.Priority(lane)
		out = append(out, u)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("send %d batched jobs online: %w", n, err)
	}
	return out, nil
}

// NearDeadline returns up to limit batched jobs of model (gathered or not)
// whose deadline is before by: the coordinator sends them online while
// there is time to run them.
func (s *Store) NearDeadline(ctx context.Context, model string, by time.Time, limit int) ([]job.Key, error) {
	ctx, stop := s.bound(ctx)
	defer stop()
	return s.keysOf(ctx, "batched jobs near their deadline", `SELECT tenant, id FROM jobs
		WHERE status = 'batched' AND model = $1 AND deadline < $2 ORDER BY deadline LIMIT $3`, model, by, limit)
}

// keysOf runs a query that returns (tenant, id) rows.
func (s *Store) keysOf(ctx context.Context, op, sql string, args ...any) ([]job.Key, error) {
	rows, err := s.pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	keys, err := collectKeyList(rows)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	return keys, nil
}

// WaitingKeys returns up to limit of model's batched jobs that wait to be
// gathered, oldest first (to send online when the model stops batching).
func (s *Store) WaitingKeys(ctx context.Context, model string, limit int) ([]job.Key, error) {
	ctx, stop := s.bound(ctx)
	defer stop()
	return s.keysOf(ctx, "waiting batched jobs of "+model, `SELECT tenant, id FROM jobs
		WHERE status = 'batched' AND batch_id IS NULL AND model = $1 ORDER BY batched_at LIMIT $2`, model, limit)
}

// BatchMember is a job of a batch, as its line is written.
type BatchMember struct {
	Key      job.Key
	Request  json.RawMessage
	Deadline *time.Time
}
