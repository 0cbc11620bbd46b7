package store_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
)

// transitionOp is one store method that moves a job to a target status.
type transitionOp struct {
	name   string
	target job.Status
	// from lists the statuses (as forceStatus writes them) it moves from.
	from []job.Status
	run  func(ctx context.Context, s *store.Store, key job.Key) error
}

func transitionOps() []transitionOp {
	ignore := func(_ bool, err error) error { return err }
	ignoreRec := func(_ store.Record, err error) error { return err }
	S := func(ss ...job.Status) []job.Status { return ss }
	// forced is the attempt that a row forceStatus made running holds.
	forced := func(k job.Key) store.Attempt { return store.Attempt{Key: k, Owner: "w1", N: 1} }
	return []transitionOp{
		{"Claim", job.StatusRunning, S(job.StatusQueued, job.StatusRetrying), func(ctx context.Context, s *store.Store, k job.Key) error {
			_, err := s.Claim(ctx, k, "w2", time.Minute)
			return err
		}},
		{"Complete", job.StatusSucceeded, S(job.StatusRunning), func(ctx context.Context, s *store.Store, k job.Key) error {
			return ignore(s.Complete(ctx, forced(k), result()))
		}},
		// Complete and CompleteBatch write their events themselves (migration 00036).
		{"CompleteBatch", job.StatusSucceeded, S(job.StatusRunning), func(ctx context.Context, s *store.Store, k job.Key) error {
			_, err := s.CompleteBatch(ctx, []store.Completion{{Attempt: forced(k), Result: result()}})
			return err
		}},
		{"Fail", job.StatusFailed, S(job.StatusRunning), func(ctx context.Context, s *store.Store, k job.Key) error {
			return ignore(s.Fail(ctx, forced(k), attemptErr("bad_request")))
		}},
		{"ScheduleRetry", job.StatusRetrying, S(job.StatusRunning), func(ctx context.Context, s *store.Store, k job.Key) error {
			return ignore(s.ScheduleRetry(ctx, forced(k), time.Now().Add(time.Minute), attemptErr("server_error")))
		}},
		{"MarkDead", job.StatusDead, S(job.StatusRunning), func(ctx context.Context, s *store.Store, k job.Key) error {
			return ignore(s.MarkDead(ctx, forced(k), attemptErr("exhausted")))
		}},
		{"Release", job.StatusQueued, S(job.StatusRunning), func(ctx context.Context, s *store.Store, k job.Key) error {
			return ignore(s.Release(ctx, k, "w1"))
		}},
		{"ReleaseBatch", job.StatusQueued, S(job.StatusRunning), func(ctx context.Context, s *store.Store, k job.Key) error {
			_, err := s.ReleaseBatch(ctx, []job.Key{k}, "w1")
			return err
		}},
		{"Requeue", job.StatusQueued, S(job.StatusRetrying), func(ctx context.Context, s *store.Store, k job.Key) error {
			return ignore(s.Requeue(ctx, k))
		}},
		{"Cancel", job.StatusCancelled, S(job.StatusQueued, job.StatusRunning, job.StatusRetrying, job.StatusBatched), func(ctx context.Context, s *store.Store, k job.Key) error {
			return ignoreRec(s.Cancel(ctx, k))
		}},
		{"MarkBatched", job.StatusBatched, S(job.StatusRunning), func(ctx context.Context, s *store.Store, k job.Key) error {
			return ignore(s.MarkBatched(ctx, forced(k)))
		}},
		// forceStatus puts a batched row in batch 0.
		{"CompleteBatched", job.StatusSucceeded, S(job.StatusBatched), func(ctx context.Context, s *store.Store, k job.Key) error {
			_, err := s.CompleteBatched(ctx, 0, []store.BatchedResult{{Key: k, Result: result()}})
			return err
		}},
		{"SendOnline", job.StatusRetrying, S(job.StatusBatched), func(ctx context.Context, s *store.Store, k job.Key) error {
			_, err := s.SendOnline(ctx, []store.Unbatch{{Key: k, Error: attemptErr("server_error")}})
			return err
		}},
		{"Replay", job.StatusQueued, S(job.StatusFailed, job.StatusDead), func(ctx context.Context, s *store.Store, k job.Key) error {
			return ignoreRec(s.Replay(ctx, k))
		}},
		{"FailQueued", job.StatusFailed, S(job.StatusQueued), func(ctx context.Context, s *store.Store, k job.Key) error {
			return ignore(s.FailQueued(ctx, k, attemptErr("model_unconfigured"), deadLetterOf(k)))
		}},
		// forceStatus writes running with a live lease, which DeadByBroker must not end.
		{"DeadByBroker", job.StatusDead, S(job.StatusQueued, job.StatusRetrying), func(ctx context.Context, s *store.Store, k job.Key) error {
			return ignore(s.DeadByBroker(ctx, k, attemptErr("delivery_limit"), deadLetterOf(k)))
		}},
		{"MarkDeadLettered", job.StatusDead, S(job.StatusRunning), func(ctx context.Context, s *store.Store, k job.Key) error {
			return ignore(s.MarkDeadLettered(ctx, forced(k), attemptErr("exhausted"), deadLetterOf(k)))
		}},
		{"ReplayDeadLetter", job.StatusQueued, S(job.StatusFailed, job.StatusDead), func(ctx context.Context, s *store.Store, k job.Key) error {
			id, err := s.RecordDeadLetter(ctx, deadLetterOf(k))
			if err != nil {
				return err
			}
			_, err = s.ReplayDeadLetter(ctx, k.Tenant, id, nil)
			return err
		}},
	}
}

// TestOpsCoverTheTransitionTable checks the op table against package job:
// every op moves only along allowed edges, and every edge has an op.
func TestOpsCoverTheTransitionTable(t *testing.T) {
	t.Parallel()
	covered := map[[2]job.Status]bool{}
	for _, op := range transitionOps() {
		for _, from := range op.from {
			require.True(t, job.CanTransition(from, op.target), "%s: %s → %s is not in the table", op.name, from, op.target)
			covered[[2]job.Status{from, op.target}] = true
		}
	}
	for _, from := range job.Statuses {
		for _, to := range job.Statuses {
			if job.CanTransition(from, to) {
				assert.True(t, covered[[2]job.Status{from, to}], "no store method moves %s → %s", from, to)
			}
		}
	}
}

// TestEveryTransitionIsGuardedByTheDatabase forces a row into each status
// by raw SQL and runs every store method on it: the allowed moves happen,
// every other one leaves the row exactly as it was. The store does no
// status check in Go, so each refusal is the database's guard.
func TestEveryTransitionIsGuardedByTheDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := newStore(t)
	for _, op := range transitionOps() {
		for _, from := range job.Statuses {
			key := job.Key{Tenant: "acme", ID: fmt.Sprintf("%s-%s", op.name, from)}
			key.ID = sanitize(key.ID)
			mustInsert(t, s, sampleJob(key.Tenant, key.ID))
			forceStatus(t, pool, key, from)
			before := mustGet(t, s, key)

			err := op.run(ctx, s, key)
			after := mustGet(t, s, key)
			if slices.Contains(op.from, from) {
				require.NoError(t, err, "%s from %s", op.name, from)
				assert.Equal(t, op.target, after.Status, "%s from %s", op.name, from)
				continue
			}
			assert.Equal(t, before, after, "%s from %s must change nothing (err %v)", op.name, from, err)
			if err != nil {
				// Only the API-facing moves explain a refusal, as a *job.TransitionError.
				var te *job.TransitionError
				require.ErrorAs(t, err, &te, "%s from %s", op.name, from)
				assert.Equal(t, from, te.From)
			}
		}
	}
}

func sanitize(id string) string {
	out := []byte(id)
	for i, c := range out {
		if c == '(' || c == ')' || c == ' ' {
			out[i] = '.'
		}
	}
	return string(out)
}

// deadLetterOf is a dead letter (kind job) of the job key.
func deadLetterOf(k job.Key) store.DeadLetterRow {
	return store.DeadLetterRow{Kind: store.DeadLetterJob, Tenant: k.Tenant, JobID: k.ID, Lane: string(job.PriorityNormal),
		Reason: "test", Body: []byte(`{"id":"` + k.ID + `"}`)}
}
