package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/internal/job"
)

// A job the direct intake hands to its own worker may run before its row
// exists (docs/design.md#write-once): when its call ends within the
// worker's store_delay the row is written once, finished (InsertFinished),
// instead of inserted claimed and then updated; otherwise the worker
// inserts it claimed (InsertClaiming) when the delay is over. Absent
// decides which jobs may go that way, UnwrittenClaim is the record the
// worker runs meanwhile.

// UnwrittenClaim is the record InsertClaiming would store for j claimed by
// owner at at: running, attempt 1, under a lease ending at at+lease.
func UnwrittenClaim(j job.Job, owner string, lease time.Duration, at time.Time) Record {
	r := insertedRecord(j, argsOf(j), at, at)
	claimedRecord(&r, owner, at.Add(lease).UTC())
	return r
}

// absentSQL returns the keys of the given jobs that no row and no
// tombstone holds and whose group (tenant, model, lane) has no parked
// rows: the jobs an insert would create and not park. The parked probe is
// insertBatchSQL's, one per group.
const absentSQL = `WITH u AS MATERIALIZED (SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::timestamptz[])
		AS u(tenant, id, model, priority, probe_from)),
	p AS MATERIALIZED (SELECT g.tenant, g.model, g.priority FROM (SELECT DISTINCT tenant, model, priority, probe_from FROM u) g
		` + parkedProbe + `)
	SELECT u.tenant, u.id FROM u
	WHERE NOT EXISTS (SELECT 1 FROM jobs j WHERE j.tenant = u.tenant AND j.id = u.id)
		AND NOT EXISTS (SELECT 1 FROM job_tombstones t WHERE t.tenant = u.tenant AND t.id = u.id)
		AND NOT EXISTS (SELECT 1 FROM p WHERE p.tenant = u.tenant AND p.model = u.model AND p.priority = u.priority)`

// Absent reports, for each job, whether an insert of it now would create
// it unparked: no row or tombstone holds its key and its group has no
// parked rows. It reads and writes nothing else; a job another caller
// inserts after it answered is found by the insert that follows
// (InsertFinished or InsertClaiming store nothing over an existing row).
func (s *Store) Absent(ctx context.Context, jobs []job.Job) ([]bool, error) {
	ctx, stop := s.bound(ctx)
	defer stop()
	out := make([]bool, len(jobs))
	if len(jobs) == 0 {
		return out, nil
	}
	n := len(jobs)
	tenants, ids, models, lanes := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	index := make(map[job.Key]int, n)
	for i, j := range jobs {
		a := argsOf(j)
		tenants[i], ids[i], models[i], lanes[i] = a.tenant, a.id, a.model, a.priority
		index[job.Key{Tenant: a.tenant, ID: a.id}] = i
	}
	rows, err := s.pool.Query(ctx, absentSQL, tenants, ids, models, lanes, s.probeStarts(tenants, models, lanes))
	if err != nil {
		return nil, fmt.Errorf("probe %d jobs: %w", n, err)
	}
	var k job.Key
	_, err = pgx.ForEachRow(rows, []any{&k.Tenant, &k.ID}, func() error {
		if i, ok := index[k]; ok {
			out[i] = true
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("probe %d jobs: %w", n, err)
	}
	return out, nil
}

// Finished is one item of InsertFinished: a job that ran before its row
// was written, and its result.
type Finished struct {
	Job   job.Job
	Owner string
	// ReadAt is when the intake read the job: the row's created_at and
	// started_at, as InsertClaiming would have stored them.
	ReadAt time.Time
	Result Result
}

// insertFinishedSQL stores jobs as completeBatchSQL leaves them: the row
// of insertBatchSQL's claimed job after its first attempt succeeded, with
// the call added to usage, finished_xid set and the outbox row written
// here for all rows at once, as the completions do (migration 00039: the
// row triggers leave such rows alone). The metadata, attempt logs,
// responses and requests are the last parameters, as in insertBatchSQL
// and for its reason.
var insertFinishedSQL = `WITH u AS MATERIALIZED (SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::jsonb[], $5::text[], $22::text[], $19::text[],
		$7::int[], $8::timestamptz[], $9::text[], $10::text[], $11::text[], $12::text[], $13::text[], $14::text[], $6::text[],
		$15::timestamptz[], $16::text[], $21::text[], $17::int[], $18::int[], $20::text[])
		AS u(tenant, id, model, fallback, priority, request, metadata, max_attempts, deadline,
			reply_to, correlation_id, callback_url, result_topic, traceparent, tracestate, kind,
			read_at, model_used, response, prompt_tokens, completion_tokens, entry)),
	done AS (INSERT INTO jobs (tenant, id, model, fallback_models, priority, request, metadata, max_attempts, deadline,
		reply_to, correlation_id, callback_url, result_topic, traceparent, tracestate, kind,
		status, attempts, model_used, response, prompt_tokens, completion_tokens,
		created_at, started_at, completed_at, updated_at, attempt_log, finished_xid)
	SELECT u.tenant, u.id, u.model, ARRAY(SELECT jsonb_array_elements_text(u.fallback)), u.priority,
		u.request::jsonb, u.metadata::jsonb, u.max_attempts, u.deadline,
		u.reply_to, u.correlation_id, u.callback_url, u.result_topic, u.traceparent, u.tracestate, u.kind,
		'succeeded', 1, u.model_used, u.response::jsonb, u.prompt_tokens, u.completion_tokens,
		u.read_at, u.read_at, now(), now(), u.entry::jsonb, pg_current_xact_id()
	FROM u
	WHERE NOT EXISTS (SELECT 1 FROM job_tombstones t WHERE t.tenant = u.tenant AND t.id = u.id)
	ORDER BY u.tenant, u.id
	ON CONFLICT (tenant, id) DO NOTHING
	RETURNING tenant, id, model_used, prompt_tokens, completion_tokens),
	` + successUsage + `,
	` + successEvents + `
	SELECT tenant, id FROM done`

// InsertFinished writes each item's job as succeeded with its result, in
// one statement, unless its key is taken (a duplicate of the job that
// another replica or the API stored meanwhile: that row stands and runs as
// stored); ok[i] reports items[i]. A key repeated in items is written once.
func (s *Store) InsertFinished(ctx context.Context, items []Finished) ([]bool, error) {
	ctx, stop := s.bound(ctx)
	defer stop()
	ok := make([]bool, len(items))
	if len(items) == 0 {
		return ok, nil
	}
	jobs := make([]job.Job, len(items))
	for i, it := range items {
		jobs[i] = it.Job
	}
	c, err := columnsOf(jobs)
	if err != nil {
		return nil, fmt.Errorf("insert finished: %w", err)
	}
	m := len(c.ids)
	readAt, models, responses, entries := make([]time.Time, 0, m), make([]string, 0, m), make([]string, 0, m), make([]string, 0, m)
	prompt, completion := make([]int32, 0, m), make([]int32, 0, m)
	for i, it := range items {
		a := c.args[i]
		if c.first[job.Key{Tenant: a.tenant, ID: a.id}] != i {
			continue
		}
		r := it.Result
		readAt = append(readAt, it.ReadAt)
		models, responses = append(models, r.ModelUsed), append(responses, responseText(r))
		prompt, completion = append(prompt, int32(r.PromptTokens)), append(completion, int32(r.CompletionTokens))
		at := Attempt{Key: job.Key{Tenant: a.tenant, ID: a.id}, Owner: it.Owner, N: 1}
		entries = append(entries, logEntry(r.Trace.successOf(at, r)))
	}
	rows, err := s.pool.Query(ctx, insertFinishedSQL, c.tenants, c.ids, c.models, c.fallbacks, c.priorities,
		c.kinds, c.maxAttempts, c.deadlines, c.replyTo, c.correlationID, c.callbackURL, c.resultTopic,
		c.traceParent, c.traceState, readAt, models, prompt, completion, c.metadata, entries, responses, c.requests)
	if err != nil {
		return nil, fmt.Errorf("insert %d finished jobs: %w", m, err)
	}
	var k job.Key
	_, err = pgx.ForEachRow(rows, []any{&k.Tenant, &k.ID}, func() error {
		if i, found := c.first[k]; found {
			ok[i] = true
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("insert %d finished jobs: %w", m, err)
	}
	return ok, nil
}
