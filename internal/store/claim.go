package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/internal/job"
)

// ClaimOutcome says what a claim found.
type ClaimOutcome int

const (
	// Claimed: the job is now running under the caller's lease; do attempt Claim.Attempt.
	Claimed ClaimOutcome = iota + 1
	// AlreadyFinished: the job is succeeded, failed or dead; nothing to do (a duplicate delivery).
	AlreadyFinished
	// Busy: another claim holds a live lease; RetryIn is the time until it expires.
	Busy
	// NotDue: the job is retrying and its next attempt is RetryIn away.
	NotDue
	// Cancelled: the job was cancelled; nothing to do.
	Cancelled
	// Exhausted: the job had used all its attempts (its last lease expired
	// without a result) and the claim moved it to dead; dead-letter it.
	Exhausted
)

func (o ClaimOutcome) String() string {
	switch o {
	case Claimed:
		return "claimed"
	case AlreadyFinished:
		return "already_finished"
	case Busy:
		return "busy"
	case NotDue:
		return "not_due"
	case Cancelled:
		return "cancelled"
	case Exhausted:
		return "exhausted"
	}
	return fmt.Sprintf("ClaimOutcome(%d)", int(o))
}

// Claim is the result of claiming one job.
type Claim struct {
	Outcome ClaimOutcome
	// Attempt is the attempt number the caller now holds (Claimed only);
	// pass it to Complete, Fail, ScheduleRetry or MarkDead.
	Attempt int
	// Record is the job's row after the claim.
	Record Record
	// RetryIn is how long until the job may be claimable (Busy, NotDue).
	RetryIn time.Duration
}

// claimSet moves a row to running under a new lease ($3 owner, $4 lease in µs).
const claimSet = `status = 'running', attempts = jobs.attempts + 1, lease_owner = $3,
	lease_expires_at = now() + $4 * interval '1 microsecond',
	started_at = coalesce(jobs.started_at, now()), next_attempt_at = NULL, updated_at = now()`

// claimGuard: a queued job, a retrying job that is due, or a running job
// whose lease expired (takeover), with an attempt left. $5 is
// job.AllowedFrom(running).
const claimGuard = `jobs.attempts < jobs.max_attempts AND (
	(jobs.status = ANY($5) AND (jobs.status <> 'retrying' OR jobs.next_attempt_at <= now()))
	OR (jobs.status = 'running' AND jobs.lease_expires_at <= now()))`

const claimSQL = `UPDATE jobs SET ` + claimSet + `
	WHERE tenant = $1 AND id = $2 AND ` + claimGuard + `
	RETURNING ` + jobColumns

// insertClaimSQL creates the job already running (attempt 1) or, when it
// exists, claims it under the same guard as Claim.
const insertClaimSQL = `INSERT INTO jobs (tenant, id, model, fallback_models, priority, request, metadata,
		max_attempts, deadline, status, attempts, lease_owner, lease_expires_at, started_at)
	VALUES ($1, $2, $6, $7, $8, $9::jsonb, $10::jsonb, $11, $12,
		'running', 1, $3, now() + $4 * interval '1 microsecond', now())
	ON CONFLICT (tenant, id) DO UPDATE SET ` + claimSet + `
	WHERE ` + claimGuard + `
	RETURNING ` + claimedColumns

func leaseMicros(lease time.Duration) int64 {
	if lease <= 0 {
		lease = time.Second
	}
	return lease.Microseconds()
}

// Claim moves the job to running under owner's lease: from queued, from
// retrying once next_attempt_at has passed, or from running when the
// previous lease expired (takeover); each claim is a new attempt. A
// duplicate delivery of a running or finished job claims nothing (Busy,
// AlreadyFinished, Cancelled, NotDue). ErrNotFound if there is no such job.
func (s *Store) Claim(ctx context.Context, key job.Key, owner string, lease time.Duration) (Claim, error) {
	c, err := s.claim(ctx, key, func() (Record, error) {
		return scanRecord(s.pool.QueryRow(ctx, claimSQL, key.Tenant, key.ID, owner, leaseMicros(lease), guard(job.StatusRunning)))
	})
	if err != nil {
		return Claim{}, fmt.Errorf("claim job %s: %w", key.ID, err)
	}
	return c, nil
}

// InsertAndClaim is for messages published straight onto the queue: it
// inserts j if absent, already running under owner's lease (attempt 1), or
// else claims the existing job exactly as Claim does; one statement either way.
func (s *Store) InsertAndClaim(ctx context.Context, j job.Job, owner string, lease time.Duration) (Claim, error) {
	a := argsOf(j)
	key := job.Key{Tenant: a.tenant, ID: a.id}
	c, err := s.claim(ctx, key, func() (Record, error) {
		rec, err := scanRecord(s.pool.QueryRow(ctx, insertClaimSQL, insertClaimArgs(a, owner, lease)...))
		return withRequest(rec, a), err
	})
	if err != nil {
		return Claim{}, fmt.Errorf("claim job %s: %w", j.ID, err)
	}
	return c, nil
}

func insertClaimArgs(a jobArgs, owner string, lease time.Duration) []any {
	return []any{a.tenant, a.id, owner, leaseMicros(lease), guard(job.StatusRunning),
		a.model, a.fallback, a.priority, a.request, a.metadata, a.maxAttempts, a.deadline}
}

// claimAttempts bounds the loop of claim and classify when the row keeps
// changing under us.
const claimAttempts = 3

// claim runs try; when it claims nothing, it classifies the job's current
// state, retrying the claim if the job became claimable meanwhile.
func (s *Store) claim(ctx context.Context, key job.Key, try func() (Record, error)) (Claim, error) {
	for range claimAttempts {
		rec, err := try()
		if err == nil {
			return Claim{Outcome: Claimed, Attempt: rec.Attempts, Record: rec}, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return Claim{}, err
		}
		c, again, err := s.classify(ctx, key)
		if err != nil || !again {
			return c, err
		}
	}
	return Claim{}, fmt.Errorf("job state kept changing during %d claims", claimAttempts)
}

// classify explains why a claim matched no row. again is true when the
// job is claimable now (it changed since the claim ran).
func (s *Store) classify(ctx context.Context, key job.Key) (c Claim, again bool, err error) {
	var now time.Time
	rec, err := scanRecord(s.pool.QueryRow(ctx, `SELECT `+jobColumns+`, now() FROM jobs WHERE tenant = $1 AND id = $2`,
		key.Tenant, key.ID), &now)
	if errors.Is(err, pgx.ErrNoRows) {
		return Claim{}, false, ErrNotFound
	}
	if err != nil {
		return Claim{}, false, err
	}
	c = Claim{Record: rec}
	switch rec.Status {
	case job.StatusSucceeded, job.StatusFailed, job.StatusDead:
		c.Outcome = AlreadyFinished
		return c, false, nil
	case job.StatusCancelled:
		c.Outcome = Cancelled
		return c, false, nil
	case job.StatusRunning:
		if rec.LeaseExpiresAt.After(now) {
			c.Outcome, c.RetryIn = Busy, rec.LeaseExpiresAt.Sub(now)
			return c, false, nil
		}
	case job.StatusRetrying:
		if rec.NextAttemptAt.After(now) {
			c.Outcome, c.RetryIn = NotDue, rec.NextAttemptAt.Sub(now)
			return c, false, nil
		}
	}
	if rec.Attempts < rec.MaxAttempts {
		return c, true, nil // claimable now
	}
	return s.exhaust(ctx, rec)
}

// exhaust moves a job that has no attempt left (queued or due-retrying, or
// running with an expired lease) to dead.
func (s *Store) exhaust(ctx context.Context, rec Record) (Claim, bool, error) {
	msg := "no attempt left"
	if rec.Status == job.StatusRunning {
		msg = fmt.Sprintf("lease of attempt %d expired without a result and no attempt is left", rec.Attempts)
	}
	entry, err := errorEntry(rec.Attempts, AttemptError{Kind: "exhausted", Model: rec.Model, Message: msg})
	if err != nil {
		return Claim{}, false, err
	}
	dead, err := scanRecord(s.pool.QueryRow(ctx, `UPDATE jobs SET status = 'dead', errors = errors || $3::jsonb,
			completed_at = now(), lease_owner = NULL, lease_expires_at = NULL, next_attempt_at = NULL, updated_at = now()
		WHERE tenant = $1 AND id = $2 AND status = ANY($4) AND attempts >= max_attempts
		  AND (status <> 'running' OR lease_expires_at <= now())
		  AND (status <> 'retrying' OR next_attempt_at <= now())
		RETURNING `+jobColumns, rec.Tenant, rec.ID, entry, guard(job.StatusDead)))
	if errors.Is(err, pgx.ErrNoRows) {
		return Claim{}, true, nil // changed meanwhile: classify again
	}
	if err != nil {
		return Claim{}, false, err
	}
	return Claim{Outcome: Exhausted, Record: dead}, false, nil
}

// claimBatchSQL is insertClaimSQL over arrays ($1 tenants, $2 ids, then
// the same $3..$5 as claimSQL, then the other columns), rows locked in key
// order so that concurrent batches cannot deadlock. Keys must be distinct.
const claimBatchSQL = `INSERT INTO jobs (tenant, id, model, fallback_models, priority, request, metadata,
		max_attempts, deadline, status, attempts, lease_owner, lease_expires_at, started_at)
	SELECT u.tenant, u.id, u.model, ARRAY(SELECT jsonb_array_elements_text(u.fallback)), u.priority,
		u.request::jsonb, u.metadata::jsonb, u.max_attempts, u.deadline,
		'running', 1, $3, now() + $4 * interval '1 microsecond', now()
	FROM unnest($1::text[], $2::text[], $6::text[], $7::jsonb[], $8::text[], $9::text[], $10::text[],
		$11::int[], $12::timestamptz[]) AS u(tenant, id, model, fallback, priority, request, metadata, max_attempts, deadline)
	ORDER BY u.tenant, u.id
	ON CONFLICT (tenant, id) DO UPDATE SET ` + claimSet + `
	WHERE ` + claimGuard + `
	RETURNING ` + claimedColumns

// ClaimBatch is InsertAndClaim for many jobs in one statement. Claims are
// returned in the order of jobs, with the same semantics per item; a key
// that appears twice is claimed once (the second is Busy). Jobs the
// statement could not claim (duplicates, running, finished) are classified
// one by one afterwards, off the hot path.
func (s *Store) ClaimBatch(ctx context.Context, jobs []job.Job, owner string, lease time.Duration) ([]Claim, error) {
	out := make([]Claim, len(jobs))
	if len(jobs) == 0 {
		return out, nil
	}
	n := len(jobs)
	c, err := columnsOf(jobs)
	if err != nil {
		return nil, fmt.Errorf("claim batch: %w", err)
	}
	args, index := c.args, c.first
	rows, err := s.pool.Query(ctx, claimBatchSQL, c.tenants, c.ids, owner, leaseMicros(lease), guard(job.StatusRunning),
		c.models, c.fallbacks, c.priorities, c.requests, c.metadata, c.maxAttempts, c.deadlines)
	if err != nil {
		return nil, fmt.Errorf("claim batch of %d jobs: %w", n, err)
	}
	claimed := make([]bool, n)
	for rows.Next() {
		rec, err := scanRecord(rows)
		if err != nil {
			rows.Close()
			return nil, fmt.Errorf("claim batch of %d jobs: %w", n, err)
		}
		i := index[rec.Key()]
		rec = withRequest(rec, args[i])
		out[i] = Claim{Outcome: Claimed, Attempt: rec.Attempts, Record: rec}
		claimed[i] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("claim batch of %d jobs: %w", n, err)
	}
	// Misses are duplicates or jobs in another state: classify them one by one.
	for i := range jobs {
		if claimed[i] {
			continue
		}
		a := args[i]
		c, err := s.claim(ctx, job.Key{Tenant: a.tenant, ID: a.id}, func() (Record, error) {
			rec, err := scanRecord(s.pool.QueryRow(ctx, insertClaimSQL, insertClaimArgs(a, owner, lease)...))
			return withRequest(rec, a), err
		})
		if err != nil {
			return nil, fmt.Errorf("claim batch: job %s: %w", a.id, err)
		}
		out[i] = c
	}
	return out, nil
}

// batchColumns is a batch of jobs as the column arrays that the unnest
// statements (ClaimBatch, InsertTxBatch) take, each key once, at its first
// occurrence.
type batchColumns struct {
	args  []jobArgs       // per job, in the batch's order
	first map[job.Key]int // index of each key's first occurrence

	tenants, ids, models, fallbacks, priorities, requests []string
	metadata                                              []*string
	maxAttempts                                           []int32
	deadlines                                             []*time.Time
}

func columnsOf(jobs []job.Job) (*batchColumns, error) {
	n := len(jobs)
	c := &batchColumns{
		args: make([]jobArgs, n), first: make(map[job.Key]int, n),
		tenants: make([]string, 0, n), ids: make([]string, 0, n), models: make([]string, 0, n),
		fallbacks: make([]string, 0, n), priorities: make([]string, 0, n), requests: make([]string, 0, n),
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
		c.fallbacks, c.priorities, c.requests = append(c.fallbacks, string(fb)), append(c.priorities, a.priority), append(c.requests, a.request)
		c.metadata, c.maxAttempts, c.deadlines = append(c.metadata, a.metadata), append(c.maxAttempts, int32(a.maxAttempts)), append(c.deadlines, a.deadline)
	}
	return c, nil
}
