package store_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
)

// batchScenario prepares a job in a given state and returns it as the
// message a consumer would receive.
func batchScenario(t *testing.T, s *store.Store, pool *pgxpool.Pool) []job.Job {
	t.Helper()
	ctx := context.Background()
	var msgs []job.Job
	add := func(id string, prepare func(j job.Job)) {
		j := sampleJob("acme", id)
		if prepare != nil {
			prepare(j)
		}
		msgs = append(msgs, j)
	}
	claimBy := func(j job.Job) {
		c, err := s.InsertAndClaim(ctx, j, "w0", time.Minute)
		require.NoError(t, err)
		require.Equal(t, store.Claimed, c.Outcome)
	}
	add("fresh", nil)
	add("queued", func(j job.Job) { mustInsert(t, s, j) })
	add("running-live", claimBy)
	add("running-stale", func(j job.Job) { claimBy(j); expireLease(t, pool, j.Key()) })
	add("retrying-due", func(j job.Job) { mustInsert(t, s, j); forceStatus(t, pool, j.Key(), job.StatusRetrying) })
	add("retrying-later", func(j job.Job) {
		claimBy(j)
		ok, err := s.ScheduleRetry(ctx, j.Key(), "w0", 1, time.Now().Add(time.Hour), attemptErr("server_error"))
		require.NoError(t, err)
		require.True(t, ok)
	})
	add("succeeded", func(j job.Job) { mustInsert(t, s, j); forceStatus(t, pool, j.Key(), job.StatusSucceeded) })
	add("failed", func(j job.Job) { mustInsert(t, s, j); forceStatus(t, pool, j.Key(), job.StatusFailed) })
	add("cancelled", func(j job.Job) { mustInsert(t, s, j); forceStatus(t, pool, j.Key(), job.StatusCancelled) })
	msgs = append(msgs, sampleJob("acme", "fresh")) // duplicate delivery inside one batch
	j := sampleJob("acme", "exhausted")
	j.MaxAttempts = 1
	claimBy(j)
	expireLease(t, pool, j.Key())
	msgs = append(msgs, j)
	return msgs
}

func TestBatchedClaimAndCompleteMatchSingle(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	single, singlePool := newStore(t)
	batched, batchedPool := newStore(t)
	msgs := batchScenario(t, single, singlePool)
	require.Equal(t, msgs, batchScenario(t, batched, batchedPool))

	var want []store.Claim
	for _, m := range msgs {
		c, err := single.InsertAndClaim(ctx, m, "w1", time.Minute)
		require.NoError(t, err, m.ID)
		want = append(want, c)
	}
	got, err := batched.ClaimBatch(ctx, msgs, "w1", time.Minute)
	require.NoError(t, err)
	require.Len(t, got, len(msgs))
	outcomes := map[store.ClaimOutcome]int{}
	for i, m := range msgs {
		w, g := want[i], got[i]
		outcomes[w.Outcome]++
		assert.Equal(t, w.Outcome, g.Outcome, m.ID)
		assert.Equal(t, w.Attempt, g.Attempt, m.ID)
		assert.Equal(t, w.Record.Status, g.Record.Status, m.ID)
		assert.Equal(t, w.Record.Attempts, g.Record.Attempts, m.ID)
		assert.Equal(t, w.Record.LeaseOwner, g.Record.LeaseOwner, m.ID)
		assert.Equal(t, len(w.Record.Errors), len(g.Record.Errors), m.ID)
		assert.Equal(t, w.RetryIn > 0, g.RetryIn > 0, m.ID)
	}
	assert.Equal(t, map[store.ClaimOutcome]int{store.Claimed: 4, store.Busy: 2, store.NotDue: 1,
		store.AlreadyFinished: 2, store.Cancelled: 1, store.Exhausted: 1}, outcomes)

	// Complete every claimed job, plus completions that must be refused: a
	// stale attempt, a wrong owner, a job that is not running.
	var items []store.Completion
	for i, c := range want {
		if c.Outcome == store.Claimed {
			items = append(items, store.Completion{Key: msgs[i].Key(), Owner: "w1", Attempt: c.Attempt, Result: result()})
		}
	}
	items = append(items,
		store.Completion{Key: job.Key{Tenant: "acme", ID: "running-stale"}, Owner: "w0", Attempt: 1, Result: result()},
		store.Completion{Key: job.Key{Tenant: "acme", ID: "running-live"}, Owner: "w1", Attempt: 1, Result: result()},
		store.Completion{Key: job.Key{Tenant: "acme", ID: "succeeded"}, Owner: "w1", Attempt: 1, Result: result()},
		store.Completion{Key: job.Key{Tenant: "acme", ID: "missing"}, Owner: "w1", Attempt: 1, Result: result()},
	)
	var wantOK []bool
	for _, it := range items {
		ok, err := single.Complete(ctx, it.Key, it.Owner, it.Attempt, it.Result)
		require.NoError(t, err)
		wantOK = append(wantOK, ok)
	}
	gotOK, err := batched.CompleteBatch(ctx, items)
	require.NoError(t, err)
	assert.Equal(t, wantOK, gotOK)
	assert.Equal(t, []bool{true, true, true, true, false, false, false, false}, gotOK)
	for _, m := range msgs {
		assert.Equal(t, mustGet(t, single, m.Key()).Status, mustGet(t, batched, m.Key()).Status, m.ID)
	}
}

// A claim returns the stored request of a job that existed (the statement
// prints it only for rows it did not insert) and the request as sent for a
// job it inserted.
func TestClaimReturnsStoredRequestOfExistingJob(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newStore(t)
	stored := sampleJob("acme", "existing")
	stored.Request = json.RawMessage(`{"messages": [{"role": "user", "content": "stored"}]}`)
	mustInsert(t, s, stored)
	resent := stored
	resent.Request = json.RawMessage(`{"messages": [{"role": "user", "content": "resent"}]}`)
	fresh := sampleJob("acme", "fresh")
	fresh.Request = json.RawMessage(`{"messages": [{"role": "user", "content": "fresh"}]}`)

	claims, err := s.ClaimBatch(ctx, []job.Job{resent, fresh}, "w1", time.Minute)
	require.NoError(t, err)
	require.Equal(t, store.Claimed, claims[0].Outcome)
	require.Equal(t, store.Claimed, claims[1].Outcome)
	assert.JSONEq(t, string(stored.Request), string(claims[0].Record.Request))
	assert.JSONEq(t, string(fresh.Request), string(claims[1].Record.Request))

	stored2, fresh2 := stored, fresh
	stored2.ID, fresh2.ID = "existing-2", "fresh-2"
	mustInsert(t, s, stored2)
	stored2.Request = resent.Request
	c, err := s.InsertAndClaim(ctx, stored2, "w1", time.Minute)
	require.NoError(t, err)
	assert.JSONEq(t, string(stored.Request), string(c.Record.Request))
	c, err = s.InsertAndClaim(ctx, fresh2, "w1", time.Minute)
	require.NoError(t, err)
	assert.JSONEq(t, string(fresh.Request), string(c.Record.Request))
}
