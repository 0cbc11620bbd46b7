package store

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/internal/job"
)

// BatchInsert is the outcome of one job of InsertBatch.
type BatchInsert struct {
	// Record is the job as stored: the job as given when Created, else the
	// row that already held its (tenant, id), or, when retention deleted
	// that row, what its tombstone keeps (see tombstoneRecords).
	Record Record
	// Created is true when this call stored the job.
	Created bool
	// Parked: the job was created parked, behind its tenant's other parked
	// jobs; no message is to be published for it.
	Parked bool
	// Claimed: the job was created claimed (InsertClaiming); Record is the
	// running attempt 1 under the caller's lease.
	Claimed bool
}

// insertBatchSQL is insertSQL over arrays, rows inserted in key order so
// that concurrent batches lock keys in the same order and cannot deadlock.
// It returns only what the caller does not already have: a created job's
// row is the job as given plus the table's defaults, and printing its
// request jsonb back would cost the server about as much as inserting it.
//
// A job of a tenant, model and lane that has parked jobs is parked itself
// (park.go): it queues behind them in Postgres instead of in the lanes, so
// a flood goes to the lanes only until the consumers start parking it. The
// check is one probe of jobs_parked_idx per group of the batch (p), not
// per row: a probe walks past the index entries it cannot see, and while a
// group is parking those are many, at both ends of its range: unparked
// jobs at the old end until a vacuum, and at the new end the rows this
// statement and the concurrent intakes are inserting
// (TestParkedProbeOncePerGroup). The probe tests parked_at alone,
// which no other index's predicate follows from
// (migrations/00034_parked_index.sql), and sits in a LIMIT 1 lateral join,
// which the planner does not turn into a hashed scan of every parked row.
// It looks past the group's cursor first ($6, parkedProbe).
//
// A key whose job the retention sweeper deleted (job_tombstones, kept for
// retention.idempotency) is not inserted: the job was processed already.
// That is one probe of a small primary key per row.
//
// A job whose park flag ($20) is set is stored parked whatever its group
// holds (Claiming.Park).
//
// With $7 set (Claiming.Running) a claimed job is not parked behind its
// group: it runs already.
//
// A job whose claim flag ($16) is set, and that is not parked, is stored
// already claimed: running, attempt 1, under the lease of $17 for $18 µs
// (InsertClaiming), with enqueued_at NULL: no message exists for it, so
// if its replica dies the reconciler publishes one when the lease has
// expired (TakeOrphaned).
//
// The metadata and the requests are the last parameters ($21, $22) on
// purpose: pgx encodes every parameter into one buffer, and a parameter
// after the requests' ~1 KB a job would copy the whole buffer into one
// twice its size.
const insertBatchSQL = `WITH u AS MATERIALIZED (SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::jsonb[], $5::text[], $22::text[], $21::text[],
		$8::int[], $9::timestamptz[], $10::text[], $11::text[], $12::text[], $13::text[], $14::text[], $15::text[], $16::bool[], $19::text[],
		$20::bool[], $6::timestamptz[])
		AS u(tenant, id, model, fallback, priority, request, metadata, max_attempts, deadline,
			reply_to, correlation_id, callback_url, result_topic, traceparent, tracestate, claim, kind, park, probe_from)),
	p AS MATERIALIZED (SELECT g.tenant, g.model, g.priority FROM (SELECT DISTINCT tenant, model, priority, probe_from FROM u) g
		` + parkedProbe + `)
	INSERT INTO jobs (tenant, id, model, fallback_models, priority, request, metadata, max_attempts, deadline, enqueued_at,
		reply_to, correlation_id, callback_url, result_topic, parked_at, traceparent, tracestate,
		status, attempts, lease_owner, lease_expires_at, started_at, kind)
	SELECT u.tenant, u.id, u.model, ARRAY(SELECT jsonb_array_elements_text(u.fallback)), u.priority,
		u.request::jsonb, u.metadata::jsonb, u.max_attempts, u.deadline, CASE WHEN c.parked OR c.run THEN NULL ELSE now() END,
		u.reply_to, u.correlation_id, u.callback_url, u.result_topic, CASE WHEN c.parked THEN now() END,
		u.traceparent, u.tracestate,
		CASE WHEN c.run THEN 'running' ELSE 'queued' END, CASE WHEN c.run THEN 1 ELSE 0 END,
		CASE WHEN c.run THEN $17 END, CASE WHEN c.run THEN now() + $18 * interval '1 microsecond' END,
		CASE WHEN c.run THEN now() END, u.kind
	FROM u LEFT JOIN p ON p.tenant = u.tenant AND p.model = u.model AND p.priority = u.priority
	CROSS JOIN LATERAL (SELECT (p.tenant IS NOT NULL AND NOT $7) OR coalesce(u.park, false) AS parked,
		coalesce(u.claim, false) AND (p.tenant IS NULL OR $7) AND NOT coalesce(u.park, false) AS run) c
	WHERE NOT EXISTS (SELECT 1 FROM job_tombstones t WHERE t.tenant = u.tenant AND t.id = u.id)
	ORDER BY u.tenant, u.id
	ON CONFLICT (tenant, id) DO NOTHING
	RETURNING tenant, id, created_at, updated_at, enqueued_at, parked_at IS NOT NULL, lease_expires_at`

// InsertBatch stores jobs as queued, each unless its (tenant, id) exists,
// in one statement (one commit, one WAL flush for the batch), and returns
// the outcome of each in the order of jobs. A key repeated within jobs is
// created once; its repeats report Created=false with the same Record.
// The jobs are normalised (job.Normalize) but not validated: validate
// them first.
//
// A created job's enqueued_at is set: its caller publishes its message
// right after this returns, and on a failed publish either takes the job
// back (Unsubmit) or clears enqueued_at (MarkUnenqueued) so the reconciler
// publishes it. A created job that was parked (BatchInsert.Parked) has no
// enqueued_at and gets no message: a consumer publishes it when its turn
// comes. Round trips: the insert, then one read of the existing
// jobs when there are any, and one of tombstones when a key not inserted
// has no row.
func (s *Store) InsertBatch(ctx context.Context, jobs []job.Job) ([]BatchInsert, error) {
	return s.InsertClaiming(ctx, jobs, Claiming{})
}

// Claiming asks InsertClaiming to store some jobs already claimed.
type Claiming struct {
	// Claim[i] set: jobs[i], when created and not parked, is stored running
	// under Owner's lease (BatchInsert.Claimed); nil claims none.
	Claim []bool
	// Park[i] set: jobs[i], when created, is stored parked (BatchInsert.Parked):
	// a caller with no room for it whose replica already holds as many of
	// its group as it takes. Park and Claim of one job are exclusive.
	Park  []bool
	Owner string
	Lease time.Duration
	// Running: the jobs Claim names run already (write-once), so they are
	// stored claimed even where their group has parked jobs.
	Running bool
}

// InsertClaiming is InsertBatch for a caller that runs some of the jobs
// itself: each job cl.Claim names is stored claimed, as ClaimBatch would
// leave it (running, attempt 1, cl.Owner's lease; enqueued_at NULL, as it has
// no message), in the
// same statement, so a job read off the intake by a replica with room for
// it needs no lane message and no claim. A job that already existed, or
// that is parked, is not claimed.
func (s *Store) InsertClaiming(ctx context.Context, jobs []job.Job, cl Claiming) ([]BatchInsert, error) {
	ctx, stop := s.bound(ctx)
	defer stop()
	out := make([]BatchInsert, len(jobs))
	if len(jobs) == 0 {
		return out, nil
	}
	n := len(jobs)
	c, err := columnsOf(jobs)
	if err != nil {
		return nil, fmt.Errorf("insert batch: %w", err)
	}
	claims, parks := c.distinct(cl.Claim), c.distinct(cl.Park)
	rows, err := s.pool.Query(ctx, insertBatchSQL,
		c.insertArgs(s.probeStarts(c.tenants, c.models, c.priorities), claims, cl.Owner, leaseMicros(cl.Lease), parks, cl.Running)...)
	if err != nil {
		return nil, fmt.Errorf("insert batch of %d jobs: %w", n, err)
	}
	created := make([]bool, n)
	var (
		key                  job.Key
		createdAt, updatedAt time.Time
		enqueuedAt, leaseEnd *time.Time
		parked               bool
	)
	_, err = pgx.ForEachRow(rows, []any{&key.Tenant, &key.ID, &createdAt, &updatedAt, &enqueuedAt, &parked, &leaseEnd}, func() error {
		i, ok := c.first[key]
		if !ok {
			return fmt.Errorf("insert returned job %s that was not given", key.ID)
		}
		rec := insertedRecord(jobs[i], c.args[i], createdAt, updatedAt)
		if enqueuedAt != nil {
			t := enqueuedAt.UTC()
			rec.EnqueuedAt = &t
		}
		if leaseEnd != nil {
			claimedRecord(&rec, cl.Owner, leaseEnd.UTC())
		}
		out[i] = BatchInsert{Record: rec, Created: true, Parked: parked, Claimed: leaseEnd != nil}
		created[i] = true
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("insert batch of %d jobs: %w", n, err)
	}
	var existing []job.Key
	for k, i := range c.first {
		if !created[i] {
			existing = append(existing, k)
		}
	}
	if len(existing) > 0 {
		recs, err := s.resubmitted(ctx, existing)
		if err != nil {
			return nil, fmt.Errorf("insert batch: read existing jobs: %w", err)
		}
		var gone []job.Key
		for _, k := range existing {
			if _, ok := recs[k]; !ok {
				gone = append(gone, k)
			}
		}
		if len(gone) > 0 {
			tombs, err := s.tombstoneRecords(ctx, c, gone, jobs)
			if err != nil {
				return nil, fmt.Errorf("insert batch: read tombstones: %w", err)
			}
			maps.Copy(recs, tombs)
		}
		for _, k := range existing {
			rec, ok := recs[k]
			if !ok {
				// Deleted between the insert and the read (an Unsubmit of
				// another caller): nothing holds the key now, and this
				// batch did not store it; the caller retries the batch.
				return nil, fmt.Errorf("insert batch: job %s vanished while it was read", k.ID)
			}
			out[c.first[k]] = BatchInsert{Record: rec}
		}
	}
	for i, a := range c.args {
		if f := c.first[job.Key{Tenant: a.tenant, ID: a.id}]; f != i {
			out[i] = BatchInsert{Record: out[f].Record}
		}
	}
	return out, nil
}

// getMany reads the rows of keys in one statement; a missing key is absent
// from the map.
func (s *Store) getMany(ctx context.Context, keys []job.Key) (map[job.Key]Record, error) {
	return readMany(ctx, s.pool, qualifiedJobColumns, keys)
}

// rowsQuerier is a pool or a transaction.
type rowsQuerier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// readMany reads columns (qualifiedJobColumns, or a variant in its order)
// of the rows of keys through q in one statement; a missing key is absent
// from the map.
func readMany(ctx context.Context, q rowsQuerier, columns string, keys []job.Key) (map[job.Key]Record, error) {
	tenants, ids := keyArrays(keys)
	rows, err := q.Query(ctx, `SELECT `+columns+` FROM jobs
		JOIN unnest($1::text[], $2::text[]) AS k(tenant, id) ON jobs.tenant = k.tenant AND jobs.id = k.id`, tenants, ids)
	if err != nil {
		return nil, err
	}
	recs, err := collectRecords(rows)
	if err != nil {
		return nil, err
	}
	out := make(map[job.Key]Record, len(recs))
	for _, rec := range recs {
		out[rec.Key()] = rec
	}
	return out, nil
}

// insertedRecord is the Record of a job the insert created: the job with
// the contract's defaults (argsOf) and the table's, and the row's times.
func insertedRecord(j job.Job, a jobArgs, createdAt, updatedAt time.Time) Record {
	j.Normalize()
	r := Record{Job: j, Status: job.StatusQueued, Errors: []AttemptError{},
		CreatedAt: createdAt.UTC(), UpdatedAt: updatedAt.UTC()}
	r.Tenant, r.ID, r.Model, r.Priority, r.MaxAttempts = a.tenant, a.id, a.model, job.Priority(a.priority), a.maxAttempts
	r.Kind = job.Kind(a.kind)
	r.FallbackModels = nil
	if len(a.fallback) > 0 {
		r.FallbackModels = a.fallback
	}
	r.Metadata = nil
	if a.metadata != nil {
		r.Metadata = json.RawMessage(*a.metadata)
	}
	if a.deadline != nil {
		d := a.deadline.UTC()
		r.Deadline = &d
	}
	return r
}

// claimedRecord makes r, as inserted, the record of its first attempt
// under owner's lease: what the insert stored for a claimed job.
func claimedRecord(r *Record, owner string, leaseEnd time.Time) {
	started := r.CreatedAt
	r.Status, r.Attempts, r.LeaseOwner, r.LeaseExpiresAt, r.StartedAt = job.StatusRunning, 1, owner, &leaseEnd, &started
}

// batchColumns is a batch of jobs as the column arrays that the unnest
// statements (InsertBatch) take, each key once, at its first
// occurrence.
type batchColumns struct {
	args  []jobArgs       // per job, in the batch's order
	first map[job.Key]int // index of each key's first occurrence

	tenants, ids, models, fallbacks, priorities      []string
	requests                                         []json.RawMessage
	kinds                                            []string
	metadata                                         []*string
	maxAttempts                                      []int32
	deadlines                                        []*time.Time
	replyTo, correlationID, callbackURL, resultTopic []*string
	traceParent, traceState                          []*string
}

// insertArgs is insertBatchSQL's parameters, $1 to $22, for c's jobs
// with the given probe starts, claim and park flags, claim owner, lease
// (µs) and Claiming.Running.
func (c *batchColumns) insertArgs(probeFrom []*time.Time, claims []bool, owner string, leaseUS int64, parks []bool, running bool) []any {
	return []any{c.tenants, c.ids, c.models, c.fallbacks, c.priorities,
		probeFrom, running, c.maxAttempts, c.deadlines, c.replyTo, c.correlationID, c.callbackURL, c.resultTopic, c.traceParent, c.traceState,
		claims, owner, leaseUS, c.kinds, parks, c.metadata, c.requests}
}

// distinct is flags (one per job given) for the jobs whose key is stored
// in c, in c's order; nil for nil.
func (c *batchColumns) distinct(flags []bool) []bool {
	if flags == nil {
		return nil
	}
	out := make([]bool, 0, len(c.ids))
	for i, a := range c.args {
		if c.first[job.Key{Tenant: a.tenant, ID: a.id}] == i {
			out = append(out, flags[i])
		}
	}
	return out
}

func columnsOf(jobs []job.Job) (*batchColumns, error) {
	n := len(jobs)
	c := &batchColumns{
		args: make([]jobArgs, n), first: make(map[job.Key]int, n),
		tenants: make([]string, 0, n), ids: make([]string, 0, n), models: make([]string, 0, n),
		fallbacks: make([]string, 0, n), priorities: make([]string, 0, n), requests: make([]json.RawMessage, 0, n),
		metadata: make([]*string, 0, n), maxAttempts: make([]int32, 0, n), deadlines: make([]*time.Time, 0, n),
	}
	for i, j := range jobs {
		a := argsOf(j)
		c.args[i] = a
		key := job.Key{Tenant: a.tenant, ID: a.id}
		if _, dup := c.first[key]; dup {
			continue
		}
		c.first[key] = i
		fb, err := json.Marshal(a.fallback)
		if err != nil {
			return nil, fmt.Errorf("job %s: encode fallback models: %w", a.id, err)
		}
		c.tenants, c.ids, c.models = append(c.tenants, a.tenant), append(c.ids, a.id), append(c.models, a.model)
		c.kinds = append(c.kinds, a.kind)
		c.fallbacks, c.priorities, c.requests = append(c.fallbacks, string(fb)), append(c.priorities, a.priority), append(c.requests, a.request)
		c.metadata, c.maxAttempts, c.deadlines = append(c.metadata, a.metadata), append(c.maxAttempts, int32(a.maxAttempts)), append(c.deadlines, a.deadline)
		c.replyTo, c.correlationID = append(c.replyTo, a.replyTo), append(c.correlationID, a.correlationID)
		c.callbackURL, c.resultTopic = append(c.callbackURL, a.callbackURL), append(c.resultTopic, a.resultTopic)
		c.traceParent, c.traceState = append(c.traceParent, a.traceParent), append(c.traceState, a.traceState)
	}
	return c, nil
}
