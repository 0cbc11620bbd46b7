package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/llmq/llmq/internal/job"
)

// Unstorable reports an error by which Postgres refused a statement for
// what its values hold rather than for the state of the server: a data
// exception (SQLSTATE class 22, such as a value jsonb cannot represent), a
// program limit (class 54, such as the stack depth a deeply nested JSON
// value needs under a small max_stack_depth, or an index row too large),
// or a NOT NULL or CHECK constraint. Trying the same values again fails
// the same way, so a batch that holds one must be split, not retried.
func Unstorable(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return false
	}
	switch {
	case strings.HasPrefix(pe.Code, "22"), strings.HasPrefix(pe.Code, "54"):
		return true
	case pe.Code == "23502", pe.Code == "23514":
		return true
	}
	return false
}

// UnstorableReason is the text a record keeps when Postgres refused to
// store what (e.g. "this job", "the provider's answer"): Postgres's
// message and its SQLSTATE, never the statement's values (the error's
// detail may quote them).
func UnstorableReason(what string, err error) string {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return "Postgres cannot store " + what
	}
	return fmt.Sprintf("Postgres cannot store %s: %s (SQLSTATE %s)", what, pe.Message, pe.Code)
}

// RefusedJob is the intake failure of a valid job j whose values Postgres
// refused (err, Unstorable): recorded under its id with Postgres's reason,
// body (its intake message) kept as the dead letter.
func RefusedJob(j job.Job, body []byte, err error) IntakeFailure {
	return IntakeFailure{Tenant: j.Tenant, ID: j.ID, Model: j.Model, Lane: j.Priority,
		Reason: UnstorableReason("this job", err), Body: body, ReplyTo: j.ReplyTo, CorrelationID: j.CorrelationID}
}

// UnstorableJobs finds the jobs of a batch that Postgres refuses to store
// on their own: parts of the batch are inserted as InsertBatch would, in
// one transaction that is rolled back, each behind a savepoint, halving
// the parts that are refused until each refused part is one job. errs[i]
// is the error that Unstorable reported for jobs[i], nil for a job that
// would be stored. All nil means the batch failed for no one job's values
// (a combination, or the server): the caller tries the batch again. err is
// a failure to ask (the server, not the jobs). Nothing is written.
//
// One refused job of n costs about 2·log2(n) inserts of halves, three
// round trips each, each under the store's timeout of its own; it runs
// only after a batch failed with Unstorable: the happy path never pays it.
func (s *Store) UnstorableJobs(ctx context.Context, jobs []job.Job) (errs []error, err error) {
	bctx, stop := s.bound(ctx)
	tx, err := s.pool.Begin(bctx)
	stop()
	if err != nil {
		return nil, fmt.Errorf("probe unstorable jobs: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck
	errs = make([]error, len(jobs))
	mid := len(jobs) / 2
	for _, part := range [][2]int{{0, mid}, {mid, len(jobs)}} {
		if err := s.probe(ctx, tx, jobs, part[0], part[1], errs); err != nil {
			return nil, fmt.Errorf("probe unstorable jobs: %w", err)
		}
	}
	return errs, nil
}

// probe finds the jobs of jobs[from:to] Postgres refuses (UnstorableJobs).
func (s *Store) probe(ctx context.Context, tx pgx.Tx, jobs []job.Job, from, to int, errs []error) error {
	if from == to {
		return nil
	}
	refused, err := s.tryInsert(ctx, tx, jobs[from:to])
	switch {
	case err != nil:
		return err
	case refused == nil:
		return nil
	case to-from == 1:
		errs[from] = refused
		return nil
	}
	mid := (from + to) / 2
	if err := s.probe(ctx, tx, jobs, from, mid, errs); err != nil {
		return err
	}
	return s.probe(ctx, tx, jobs, mid, to, errs)
}

// tryInsert inserts jobs in tx behind a savepoint it then rolls back to,
// and returns the error by which Postgres refused their values, if it did.
func (s *Store) tryInsert(ctx context.Context, tx pgx.Tx, jobs []job.Job) (refused, err error) {
	ctx, stop := s.bound(ctx)
	defer stop()
	c, err := columnsOf(jobs)
	if err != nil {
		return nil, err
	}
	if _, err := tx.Exec(ctx, "SAVEPOINT unstorable"); err != nil {
		return nil, err
	}
	none := make([]bool, len(c.ids))
	_, ierr := tx.Exec(ctx, insertBatchSQL, c.insertArgs(make([]*time.Time, len(c.ids)), none, "", 0, none, false)...)
	switch {
	case ierr == nil:
	case Unstorable(ierr):
		refused = ierr
	default:
		return nil, ierr
	}
	if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT unstorable"); err != nil {
		return nil, err
	}
	return refused, nil
}
