package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
)

// batchScenario prepares jobs in every claimable and unclaimable state and
// returns the keys of the messages a consumer would receive for them: a
// message is only a wake-up, so the worker passes keys.
func batchScenario(t *testing.T, s *store.Store, pool *pgxpool.Pool) []job.Key {
	t.Helper()
	ctx := context.Background()
	var keys []job.Key
	add := func(id string, prepare func(j job.Job)) {
		j := sampleJob("acme", id)
		if prepare != nil {
			prepare(j)
		}
		keys = append(keys, j.Key())
	}
	claimBy := func(j job.Job) { insertClaimed(t, s, j, "w0", time.Minute) }
	add("missing", nil) // a message whose job llmq never stored
	add("queued", func(j job.Job) { mustInsert(t, s, j) })
	add("running-live", claimBy)
	add("running-stale", func(j job.Job) { claimBy(j); expireLease(t, pool, j.Key()) })
	add("retrying-due", func(j job.Job) { mustInsert(t, s, j); forceStatus(t, pool, j.Key(), job.StatusRetrying) })
	add("retrying-later", func(j job.Job) {
		claimBy(j)
		ok, err := s.ScheduleRetry(ctx, store.Attempt{Key: j.Key(), Owner: "w0", N: 1}, time.Now().Add(time.Hour), attemptErr("server_error"))
		require.NoError(t, err)
		require.True(t, ok)
	})
	add("succeeded", func(j job.Job) { mustInsert(t, s, j); forceStatus(t, pool, j.Key(), job.StatusSucceeded) })
	add("failed", func(j job.Job) { mustInsert(t, s, j); forceStatus(t, pool, j.Key(), job.StatusFailed) })
	add("cancelled", func(j job.Job) { mustInsert(t, s, j); forceStatus(t, pool, j.Key(), job.StatusCancelled) })
	keys = append(keys, job.Key{Tenant: "acme", ID: "queued"}) // duplicate delivery inside one batch
	j := sampleJob("acme", "exhausted")
	j.MaxAttempts = 1
	claimBy(j)
	expireLease(t, pool, j.Key())
	keys = append(keys, j.Key())
	return keys
}

func TestBatchedClaimAndCompleteMatchSingle(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	single, singlePool := newStore(t)
	batched, batchedPool := newStore(t)
	keys := batchScenario(t, single, singlePool)
	require.Equal(t, keys, batchScenario(t, batched, batchedPool))

	var want []store.Claim
	for _, k := range keys {
		c, err := single.Claim(ctx, k, "w1", time.Minute)
		if errors.Is(err, store.ErrNotFound) {
			c, err = store.Claim{Outcome: store.NotFound}, nil // ClaimBatch's word for it
		}
		require.NoError(t, err, k.ID)
		want = append(want, c)
	}
	got, err := batched.ClaimBatch(ctx, keys, "w1", time.Minute)
	require.NoError(t, err)
	require.Len(t, got, len(keys))
	outcomes := map[store.ClaimOutcome]int{}
	for i, k := range keys {
		w, g := want[i], got[i]
		outcomes[w.Outcome]++
		assert.Equal(t, w.Outcome, g.Outcome, k.ID)
		assert.Equal(t, w.Attempt, g.Attempt, k.ID)
		assert.Equal(t, w.Record.Status, g.Record.Status, k.ID)
		assert.Equal(t, w.Record.Attempts, g.Record.Attempts, k.ID)
		assert.Equal(t, w.Record.LeaseOwner, g.Record.LeaseOwner, k.ID)
		assert.Equal(t, len(w.Record.Errors), len(g.Record.Errors), k.ID)
		assert.Equal(t, w.RetryIn > 0, g.RetryIn > 0, k.ID)
		if g.Outcome != store.NotFound {
			assert.Equal(t, k, g.Record.Key(), "claim %d names its own job", i)
		}
	}
	assert.Equal(t, map[store.ClaimOutcome]int{store.Claimed: 3, store.Busy: 2, store.NotDue: 1,
		store.AlreadyFinished: 2, store.Cancelled: 1, store.Exhausted: 1, store.NotFound: 1}, outcomes)

	// Complete every claimed job, plus completions that must be refused: a
	// stale attempt, a wrong owner, a job that is not running, a missing one.
	var items []store.Completion
	for _, c := range want {
		if c.Outcome == store.Claimed {
			items = append(items, store.Completion{Attempt: c.AttemptOf("w1"), Result: result()})
		}
	}
	items = append(items,
		store.Completion{Attempt: store.Attempt{Key: job.Key{Tenant: "acme", ID: "running-stale"}, Owner: "w0", N: 1}, Result: result()},
		store.Completion{Attempt: store.Attempt{Key: job.Key{Tenant: "acme", ID: "running-live"}, Owner: "w1", N: 1}, Result: result()},
		store.Completion{Attempt: store.Attempt{Key: job.Key{Tenant: "acme", ID: "succeeded"}, Owner: "w1", N: 1}, Result: result()},
		store.Completion{Attempt: store.Attempt{Key: job.Key{Tenant: "acme", ID: "missing"}, Owner: "w1", N: 1}, Result: result()},
	)
	var wantOK []bool
	for _, it := range items {
		ok, err := single.Complete(ctx, it.Attempt, it.Result)
		require.NoError(t, err)
		wantOK = append(wantOK, ok)
	}
	gotOK, err := batched.CompleteBatch(ctx, items)
	require.NoError(t, err)
	assert.Equal(t, wantOK, gotOK)
	assert.Equal(t, []bool{true, true, true, false, false, false, false}, gotOK)
	for _, k := range keys {
		if k.ID == "missing" {
			continue
		}
		assert.Equal(t, mustGet(t, single, k).Status, mustGet(t, batched, k).Status, k.ID)
	}
	_, err = batched.Get(ctx, job.Key{Tenant: "acme", ID: "missing"})
	assert.ErrorIs(t, err, store.ErrNotFound, "a claim never creates a row")
}

// The worker runs the stored job, never the message's copy: a message
// carrying another request (or model) for the key claims the row as it is
// stored, and the claimed Record is exactly the row.
func TestClaimReturnsTheStoredJob(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newStore(t)
	stored := sampleJob("acme", "existing")
	stored.Request = json.RawMessage(`{"messages": [{"role": "user", "content": "stored"}]}`)
	mustInsert(t, s, stored)
	message := stored
	message.Model = "other-model"
	message.Request = json.RawMessage(`{"messages": [{"role": "user", "content": "from the message"}]}`)

	claims, err := s.ClaimBatch(ctx, []job.Key{message.Key()}, "w1", time.Minute)
	require.NoError(t, err)
	require.Len(t, claims, 1)
	require.Equal(t, store.Claimed, claims[0].Outcome)
	got := claims[0].Record
	assert.JSONEq(t, string(stored.Request), string(got.Request))
	assert.Equal(t, stored.Model, got.Model)
	assert.Equal(t, mustGet(t, s, stored.Key()), got, "the claimed record is the row after the claim")

	// Claim (one key) does the same.
	stored.ID = "existing-2"
	mustInsert(t, s, stored)
	c, err := s.Claim(ctx, stored.Key(), "w1", time.Minute)
	require.NoError(t, err)
	require.Equal(t, store.Claimed, c.Outcome)
	assert.JSONEq(t, string(stored.Request), string(c.Record.Request))
	assert.Equal(t, mustGet(t, s, stored.Key()), c.Record)
}

func TestClaimBatchNotFoundAndDuplicates(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newStore(t)
	a := mustInsert(t, s, sampleJob("acme", "a"))
	b := mustInsert(t, s, sampleJob("acme", "b"))
	mustInsert(t, s, sampleJob("globex", "ghost"))
	ghost := job.Key{Tenant: "acme", ID: "ghost"} // only another tenant has the id

	keys := []job.Key{b.Key(), ghost, a.Key(), b.Key(), {Tenant: "acme", ID: "never"}, a.Key()}
	claims, err := s.ClaimBatch(ctx, keys, "w1", time.Minute)
	require.NoError(t, err)
	require.Len(t, claims, len(keys))

	type want struct {
		outcome store.ClaimOutcome
		attempt int
	}
	wants := []want{{store.Claimed, 1}, {store.NotFound, 0}, {store.Claimed, 1}, {store.Busy, 0}, {store.NotFound, 0}, {store.Busy, 0}}
	for i, w := range wants {
		c := claims[i]
		assert.Equal(t, w.outcome, c.Outcome, "key %d (%s)", i, keys[i].ID)
		assert.Equal(t, w.attempt, c.Attempt, "key %d (%s)", i, keys[i].ID)
		switch c.Outcome {
		case store.NotFound:
			assert.Equal(t, store.Record{}, c.Record, "key %d: no row, no record", i)
		case store.Busy:
			assert.Positive(t, c.RetryIn, "key %d", i)
			assert.LessOrEqual(t, c.RetryIn, time.Minute, "key %d", i)
			assert.Equal(t, "w1", c.Record.LeaseOwner, "key %d: held by the first claim of the batch", i)
		}
	}
	for _, k := range []job.Key{a.Key(), b.Key()} {
		rec := mustGet(t, s, k)
		assert.Equal(t, job.StatusRunning, rec.Status, k.ID)
		assert.Equal(t, 1, rec.Attempts, "%s: a repeated key is claimed once", k.ID)
	}
	assert.Equal(t, job.StatusQueued, mustGet(t, s, job.Key{Tenant: "globex", ID: "ghost"}).Status,
		"another tenant's job of the same id is not claimed")

	empty, err := s.ClaimBatch(ctx, nil, "w1", time.Minute)
	require.NoError(t, err)
	assert.Empty(t, empty)
}
