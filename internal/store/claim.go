package store

import (
	"context"
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
	// NotFound: no row has the key (ClaimBatch only; Claim returns
	// ErrNotFound). The message names a job llmq never stored.
	NotFound
	// Batched: the job waits in a provider batch (internal/offload), which
	// stores its result or sends it back online with a message of its
	// own; nothing to do.
	Batched
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
	case NotFound:
		return "not_found"
	case Batched:
		return "batched"
	}
	return fmt.Sprintf("ClaimOutcome(%d)", int(o))
}

// Claim is the result of claiming one job.
type Claim struct {
	Outcome ClaimOutcome
	// Attempt is the attempt number the caller now holds (Claimed only);
	// AttemptOf names that attempt for the methods that end it.
	Attempt int
	// Record is the job's row after the claim.
	Record Record
	// RetryIn is how long until the job may be claimable (Busy, NotDue).
	RetryIn time.Duration
}

// Attempt names the running attempt a claim handed out: the job, the
// owner that claimed it and the attempt number N (Claim.Attempt). The
// methods that end an attempt (Complete, CompleteBatch, Fail,
// ScheduleRetry, DeferRateLimited, MarkDead, MarkDeadLettered) succeed
// only while that claim holds: the job is still running under Owner's
// lease, at attempt N.
type Attempt struct {
	Key   job.Key
	Owner string
	N     int
}

// AttemptOf is the attempt that c, a Claimed claim made by owner, handed
// out.
func (c Claim) AttemptOf(owner string) Attempt {
	return Attempt{Key: c.Record.Key(), Owner: owner, N: c.Attempt}
}

// claimSet moves a row to running under a new lease ($3 owner, $4 lease in
// µs). A job parked while a duplicate message of it was on its way is not
// parked once that message claims it.
// A takeover ends the expired attempt, whose worker never did, in its log.
var claimSet = `status = 'running', attempts = jobs.attempts + 1, lease_owner = $3,
	attempt_log = CASE WHEN jobs.status = 'running' THEN jobs.attempt_log || ` + endedBySQL(OutcomeLeaseExpired, "jobs.lease_expires_at") + `
		ELSE jobs.attempt_log END,
	lease_expires_at = now() + $4 * interval '1 microsecond',
	started_at = coalesce(jobs.started_at, now()), next_attempt_at = NULL, parked_at = NULL, updated_at = now()`

// claimGuard: a queued job, a retrying job that is due, or a running job
// whose lease expired (takeover), with an attempt left. $5 is
// job.AllowedFrom(running).
const claimGuard = `jobs.attempts < jobs.max_attempts AND (
	(jobs.status = ANY($5) AND (jobs.status <> 'retrying' OR jobs.next_attempt_at <= now()))
	OR (jobs.status = 'running' AND jobs.lease_expires_at <= now()))`

var claimSQL = `UPDATE jobs SET ` + claimSet + `
	WHERE tenant = $1 AND id = $2 AND ` + claimGuard + `
	RETURNING ` + jobColumns

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
	ctx, stop := s.bound(ctx)
	defer stop()
	c, err := s.claim(ctx, key, func() (Record, error) {
		return scanRecord(s.pool.QueryRow(ctx, claimSQL, key.Tenant, key.ID, owner, leaseMicros(lease), guard(job.StatusRunning)))
	})
	if err != nil {
		return Claim{}, fmt.Errorf("claim job %s: %w", key.ID, err)
	}
	return c, nil
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
	case job.StatusBatched:
		c.Outcome = Batched
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
// running with an expired lease) to dead, and records its dead letter in
// the same transaction, so a dead job is always listed in the DLQ (as
// MarkDeadLettered keeps it): a dead letter written after the commit
// would be lost with a failed write or a crash in between, and the next
// delivery would find the job finished.
func (s *Store) exhaust(ctx context.Context, rec Record) (Claim, bool, error) {
	msg := "no attempt left"
	if rec.Status == job.StatusRunning {
		msg = fmt.Sprintf("lease of attempt %d expired without a result and no attempt is left", rec.Attempts)
	}
	ae := AttemptError{Attempt: rec.Attempts, Kind: "exhausted", Model: rec.Model, Message: msg, At: time.Now().UTC()}
	entry, err := errorEntry(rec.Attempts, ae)
	if err != nil {
		return Claim{}, false, err
	}
	var dead Record
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		dead, err = scanRecord(tx.QueryRow(ctx, `UPDATE jobs SET status = 'dead', errors = errors || $3::jsonb,
				attempt_log = CASE WHEN status = 'running' THEN attempt_log || `+endedBySQL(OutcomeLeaseExpired, "lease_expires_at")+` ELSE attempt_log END,
				completed_at = now(), lease_owner = NULL, lease_expires_at = NULL, next_attempt_at = NULL, updated_at = now()
			WHERE tenant = $1 AND id = $2 AND status = ANY($4) AND attempts >= max_attempts
			  AND (status <> 'running' OR lease_expires_at <= now())
			  AND (status <> 'retrying' OR next_attempt_at <= now())
			RETURNING `+jobColumns, rec.Tenant, rec.ID, entry, guard(job.StatusDead)))
		if err != nil {
			return err
		}
		dl := JobDeadLetter(dead.Job, dead.Attempts, ReasonExhausted, dead.Errors, ae)
		if dl.Body == nil {
			dl.Body = dead.Request
		}
		_, err = recordDeadLetter(ctx, tx, dl)
		return err
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return Claim{}, true, nil // changed meanwhile: classify again
	}
	if err != nil {
		return Claim{}, false, err
	}
	return Claim{Outcome: Exhausted, Record: dead}, false, nil
}

// claimBatchSQL is claimSQL over arrays ($1 tenants, $2 ids, then the same
// $3..$5 as claimSQL), rows locked in key order so that concurrent batches
// cannot deadlock. Keys must be distinct.
var claimBatchSQL = `UPDATE jobs SET ` + claimSet + `
	FROM (SELECT k.tenant, k.id FROM unnest($1::text[], $2::text[]) AS k(tenant, id)
		ORDER BY k.tenant, k.id) AS k
	WHERE ` + byKey("k", claimGuard) + `
	RETURNING ` + qualifiedJobColumns

// ClaimBatch is Claim for many jobs in one statement: claims come back in
// the order of keys, with the same outcomes as Claim, and NotFound for a
// key that has no row (a message whose job llmq never stored). A key that
// appears twice is claimed once (the second is Busy). Keys the statement
// could not claim are classified one by one afterwards, off the hot path.
// The claimed Record holds the stored job, which is what runs: never the
// message's copy of it.
func (s *Store) ClaimBatch(ctx context.Context, keys []job.Key, owner string, lease time.Duration) ([]Claim, error) {
	ctx, stop := s.bound(ctx)
	defer stop()
	out := make([]Claim, len(keys))
	if len(keys) == 0 {
		return out, nil
	}
	n := len(keys)
	first := make(map[job.Key]int, n)
	tenants, ids := make([]string, 0, n), make([]string, 0, n)
	for i, k := range keys {
		if _, dup := first[k]; dup {
			continue
		}
		first[k] = i
		tenants, ids = append(tenants, k.Tenant), append(ids, k.ID)
	}
	rows, err := s.pool.Query(ctx, claimBatchSQL, tenants, ids, owner, leaseMicros(lease), guard(job.StatusRunning))
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
		i := first[rec.Key()]
		out[i] = Claim{Outcome: Claimed, Attempt: rec.Attempts, Record: rec}
		claimed[i] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("claim batch of %d jobs: %w", n, err)
	}
	// Misses are duplicates, missing rows or jobs in another state.
	for i, key := range keys {
		if claimed[i] {
			continue
		}
		c, err := s.Claim(ctx, key, owner, lease)
		switch {
		case errors.Is(err, ErrNotFound):
			out[i] = Claim{Outcome: NotFound}
		case err != nil:
			return nil, fmt.Errorf("claim batch: %w", err)
		default:
			out[i] = c
		}
	}
	return out, nil
}
