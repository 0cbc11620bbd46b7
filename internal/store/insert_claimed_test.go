package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
)

// InsertClaiming stores the jobs it is asked to claim as ClaimBatch would
// leave them, and claims nothing that existed already or that is parked.
func TestInsertClaiming(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newStore(t)
	existing := mustInsert(t, s, sampleJob("acme", "old"))
	parkedFirst := sampleJob("flood", "first")
	mustInsert(t, s, parkedFirst)
	_, err := s.Park(ctx, []job.Key{parkedFirst.Key()})
	require.NoError(t, err)

	jobs := []job.Job{
		sampleJob("acme", "new"),   // claimed
		sampleJob("acme", "old"),   // exists: not claimed
		sampleJob("flood", "next"), // behind a parked job: parked, not claimed
		sampleJob("acme", "plain"), // not asked
		sampleJob("acme", "new"),   // repeat of item 0
	}
	res, err := s.InsertClaiming(ctx, jobs, store.Claiming{
		Claim: []bool{true, true, true, false, true}, Owner: "replica-a", Lease: time.Minute})
	require.NoError(t, err)

	claimed := res[0]
	assert.True(t, claimed.Created)
	assert.True(t, claimed.Claimed)
	assert.Equal(t, job.StatusRunning, claimed.Record.Status)
	assert.Equal(t, 1, claimed.Record.Attempts)
	assert.Equal(t, "replica-a", claimed.Record.LeaseOwner)
	stored := mustGet(t, s, claimed.Record.Key())
	assert.Equal(t, stored.Status, claimed.Record.Status)
	assert.Equal(t, stored.Attempts, claimed.Record.Attempts)
	assert.Equal(t, stored.LeaseOwner, claimed.Record.LeaseOwner)
	require.NotNil(t, stored.LeaseExpiresAt)
	assert.WithinDuration(t, stored.LeaseExpiresAt.UTC(), claimed.Record.LeaseExpiresAt.UTC(), 0)
	require.NotNil(t, stored.StartedAt)
	assert.WithinDuration(t, time.Now().Add(time.Minute), *stored.LeaseExpiresAt, 30*time.Second)
	assert.Nil(t, stored.EnqueuedAt, "a job taken directly has no message")

	assert.False(t, res[1].Created)
	assert.False(t, res[1].Claimed, "an existing job is not claimed by its resubmission")
	assert.Equal(t, existing.Status, mustGet(t, s, existing.Key()).Status)

	assert.True(t, res[2].Parked)
	assert.False(t, res[2].Claimed, "a job behind its tenant's parked jobs waits its turn")
	assert.Equal(t, job.StatusQueued, mustGet(t, s, res[2].Record.Key()).Status)

	assert.True(t, res[3].Created)
	assert.False(t, res[3].Claimed)
	assert.Equal(t, job.StatusQueued, mustGet(t, s, res[3].Record.Key()).Status)

	assert.False(t, res[4].Claimed, "a repeat is claimed once, by its first occurrence")

	// The claimed attempt is a real one: its result is stored like any claim's.
	a := store.Attempt{Key: claimed.Record.Key(), Owner: "replica-a", N: claimed.Record.Attempts}
	ok, err := s.CompleteBatch(ctx, []store.Completion{{Attempt: a, Result: result()}})
	require.NoError(t, err)
	assert.Equal(t, []bool{true}, ok)
	assert.Equal(t, job.StatusSucceeded, mustGet(t, s, a.Key).Status)
}

// TakeOrphaned finds the running jobs that have no message once their
// lease expired (their replica died), in every tenant, marks them enqueued
// and leaves every other running job alone; a claim then takes them over.
func TestTakeOrphaned(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newStore(t)
	claiming := func(owner string, lease time.Duration, jobs ...job.Job) {
		claim := make([]bool, len(jobs))
		for i := range claim {
			claim[i] = true
		}
		res, err := s.InsertClaiming(ctx, jobs, store.Claiming{Claim: claim, Owner: owner, Lease: lease})
		require.NoError(t, err)
		for _, r := range res {
			require.True(t, r.Claimed)
		}
	}
	claiming("dead", time.Millisecond, sampleJob("acme", "orphan-1"), sampleJob("zeta", "orphan-2"))
	claiming("alive", time.Hour, sampleJob("acme", "live"))
	insertClaimed(t, s, sampleJob("beta", "lane"), "dead", time.Millisecond) // has its message
	queued := insertKey(t, s, sampleJob("beta", "queued"))
	require.NoError(t, s.MarkUnenqueued(ctx, queued))

	recs, err := s.TakeOrphaned(ctx, 100)
	require.NoError(t, err)
	assert.ElementsMatch(t, []job.Key{{Tenant: "acme", ID: "orphan-1"}, {Tenant: "zeta", ID: "orphan-2"}}, keysOf(recs),
		"a live lease, a job with a message and a queued job are not orphans")
	for _, r := range recs {
		assert.NotNil(t, r.EnqueuedAt, r.ID)
	}
	again, err := s.TakeOrphaned(ctx, 100)
	require.NoError(t, err)
	assert.Empty(t, again, "taken once")

	require.NoError(t, s.MarkUnenqueued(ctx, job.Key{Tenant: "acme", ID: "orphan-1"}))
	recs, err = s.TakeOrphaned(ctx, 1)
	require.NoError(t, err)
	assert.Equal(t, []job.Key{{Tenant: "acme", ID: "orphan-1"}}, keysOf(recs), "a failed publish unmarks it: taken again")

	c, err := s.Claim(ctx, job.Key{Tenant: "acme", ID: "orphan-1"}, "rescuer", time.Minute)
	require.NoError(t, err)
	assert.Equal(t, store.Claimed, c.Outcome, "the expired lease is taken over")
	assert.Equal(t, 2, c.Attempt)
}
