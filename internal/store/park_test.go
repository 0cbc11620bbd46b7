package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
)

// Park takes queued jobs only; a parked job has no message, is invisible
// to the reconciler's sweep of jobs that need one, and is listed by group.
func TestParkOnlyQueued(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := newStore(t)
	var keys []job.Key
	for _, st := range job.Statuses {
		key := job.Key{Tenant: "acme", ID: "park-" + string(st)}
		mustInsert(t, s, sampleJob(key.Tenant, key.ID))
		forceStatus(t, pool, key, st)
		keys = append(keys, key)
	}
	parked, err := s.Park(ctx, append(keys, job.Key{Tenant: "acme", ID: "missing"}))
	require.NoError(t, err)
	for i, st := range job.Statuses {
		assert.Equal(t, st == job.StatusQueued, parked[i], "park a %s job", st)
		rec := mustGet(t, s, keys[i])
		if st == job.StatusQueued {
			assert.Nil(t, rec.EnqueuedAt, "a parked job has no message")
		}
	}
	assert.False(t, parked[len(parked)-1], "a missing job")

	need, err := s.Unenqueued(ctx, 100)
	require.NoError(t, err)
	for _, rec := range need {
		assert.NotEqual(t, "park-queued", rec.ID, "the reconciler must not publish a parked job")
	}
	groups, err := s.ParkedGroups(ctx)
	require.NoError(t, err)
	assert.Equal(t, []store.ParkedGroup{{Tenant: "acme", Model: "qwen-plus", Lane: job.PriorityNormal}}, groups)
}

// floodGroup is the group of parkFlood's tenant "flood".
var floodGroup = store.ParkedGroup{Tenant: "flood", Model: "qwen-plus", Lane: job.PriorityNormal}

// parkFlood stores and parks n jobs of tenant "flood", oldest first, and
// one of tenant "steady" (s1): two parked groups.
func parkFlood(t *testing.T, s *store.Store, n int) []job.Key {
	t.Helper()
	var flood []job.Key
	for i := range n {
		key := job.Key{Tenant: "flood", ID: fmt.Sprintf("f%02d", i)}
		mustInsert(t, s, sampleJob(key.Tenant, key.ID))
		flood = append(flood, key)
		time.Sleep(time.Millisecond) // distinct created_at
	}
	other := job.Key{Tenant: "steady", ID: "s1"}
	mustInsert(t, s, sampleJob(other.Tenant, other.ID))
	_, err := s.Park(context.Background(), append(append([]job.Key{}, flood...), other))
	require.NoError(t, err)
	return flood
}

// Unpark hands out a group's parked jobs oldest first, each once, with
// their message recorded; other groups are untouched.
func TestUnparkOldestFirstOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newStore(t)
	flood := parkFlood(t, s, 10)

	groups, err := s.ParkedGroups(ctx)
	require.NoError(t, err)
	require.Len(t, groups, 2)

	g := floodGroup
	first, err := s.Unpark(ctx, g, 4)
	require.NoError(t, err)
	assert.ElementsMatch(t, flood[:4], first)
	rest, err := s.Unpark(ctx, g, 100)
	require.NoError(t, err)
	assert.ElementsMatch(t, flood[4:], rest)
	none, err := s.Unpark(ctx, g, 100)
	require.NoError(t, err)
	assert.Empty(t, none)
	for _, k := range flood {
		assert.NotNil(t, mustGet(t, s, k).EnqueuedAt, "an unparked job's message is recorded before it is published")
	}
	groups, err = s.ParkedGroups(ctx)
	require.NoError(t, err)
	assert.Equal(t, []store.ParkedGroup{{Tenant: "steady", Model: "qwen-plus", Lane: job.PriorityNormal}}, groups)
}

// UnparkClaiming takes a group's parked jobs oldest first and claims them
// in the same statement: running under the caller's lease, with no
// message, each at its first attempt; another group stays parked.
func TestUnparkClaiming(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newStore(t)
	flood := parkFlood(t, s, 6)

	g := floodGroup
	first, err := s.UnparkClaiming(ctx, g, 4, "w1", time.Minute)
	require.NoError(t, err)
	require.Len(t, first, 4)
	for i, rec := range first {
		assert.Equal(t, flood[i], rec.Key(), "oldest first")
		assert.Equal(t, job.StatusRunning, rec.Status)
		assert.Equal(t, 1, rec.Attempts)
		assert.Nil(t, rec.EnqueuedAt, "claimed by the unparker: no message")
		stored := mustGet(t, s, rec.Key())
		assert.Equal(t, "w1", stored.LeaseOwner)
		assert.Nil(t, stored.EnqueuedAt)
	}
	// The claim is an attempt like any other: it can be completed.
	ok, err := s.Complete(ctx, store.Attempt{Key: flood[0], Owner: "w1", N: 1}, store.Result{ModelUsed: "qwen-plus", Response: []byte(`{}`)})
	require.NoError(t, err)
	assert.True(t, ok)

	rest, err := s.UnparkClaiming(ctx, g, 100, "w2", time.Minute)
	require.NoError(t, err)
	require.Len(t, rest, 2)
	assert.Equal(t, []job.Key{flood[4], flood[5]}, []job.Key{rest[0].Key(), rest[1].Key()})
	none, err := s.UnparkClaiming(ctx, g, 100, "w2", time.Minute)
	require.NoError(t, err)
	assert.Empty(t, none)
	groups, err := s.ParkedGroups(ctx)
	require.NoError(t, err)
	assert.Equal(t, []store.ParkedGroup{{Tenant: "steady", Model: "qwen-plus", Lane: job.PriorityNormal}}, groups)
}

// A duplicate message that claims a parked job takes it out of parking, so
// a later hand-back does not leave a queued job both parked and published.
func TestClaimUnparks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newStore(t)
	key := job.Key{Tenant: "acme", ID: "dup"}
	mustInsert(t, s, sampleJob(key.Tenant, key.ID))
	_, err := s.Park(ctx, []job.Key{key})
	require.NoError(t, err)
	claims, err := s.ClaimBatch(ctx, []job.Key{key}, "w1", time.Minute)
	require.NoError(t, err)
	require.Equal(t, store.Claimed, claims[0].Outcome)
	ok, err := s.Release(ctx, key, "w1")
	require.NoError(t, err)
	require.True(t, ok)
	groups, err := s.ParkedGroups(ctx)
	require.NoError(t, err)
	assert.Empty(t, groups)
}

// A job inserted while its tenant, model and lane have parked jobs is
// parked behind them, with no message; other groups are published as usual.
func TestInsertBehindParked(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newStore(t)
	first := job.Key{Tenant: "flood", ID: "first"}
	mustInsert(t, s, sampleJob(first.Tenant, first.ID))
	_, err := s.Park(ctx, []job.Key{first})
	require.NoError(t, err)

	low := sampleJob("flood", "low")
	low.Priority = job.PriorityLow
	res, err := s.InsertBatch(ctx, []job.Job{sampleJob("flood", "next"), sampleJob("steady", "s1"), low})
	require.NoError(t, err)
	assert.True(t, res[0].Created)
	assert.True(t, res[0].Parked, "behind the tenant's parked job")
	assert.False(t, res[1].Parked, "another tenant")
	assert.False(t, res[2].Parked, "another lane")
	assert.NotNil(t, res[1].Record.EnqueuedAt)

	g := floodGroup
	keys, err := s.Unpark(ctx, g, 10)
	require.NoError(t, err)
	assert.Equal(t, []job.Key{first, {Tenant: "flood", ID: "next"}}, keys, "oldest first")

	res, err = s.InsertBatch(ctx, []job.Job{sampleJob("flood", "after")})
	require.NoError(t, err)
	assert.False(t, res[0].Parked, "nothing parked any more: published as usual")
}

// TokensToday sums today's usage per tenant over models and hours, and
// leaves earlier days out.
func TestTokensToday(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := newStore(t)
	_, err := pool.Exec(ctx, `INSERT INTO usage_hours (bucket, tenant, model, shard, calls, input_tokens, output_tokens) VALUES
		(date_trunc('hour', now()), 'acme', 'm1', 0, 1, 100, 20),
		(date_trunc('hour', now()), 'acme', 'm2', 3, 1, 5, 5),
		(date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC', 'acme', 'm1', 1, 1, 1, 1),
		(date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' - interval '1 hour', 'acme', 'm1', 0, 1, 1000, 1000),
		(date_trunc('hour', now()), 'globex', 'm1', 0, 1, 7, 0)`)
	require.NoError(t, err)
	got, err := s.TokensToday(ctx)
	require.NoError(t, err)
	assert.Equal(t, map[string]int64{"acme": 132, "globex": 7}, got)
}

// A parked row is a queued row: whatever statement moves a parked job out
// of queued clears parked_at (migrations/00034_parked_index.sql), so the
// parked index and the probes that read parked_at alone never see it, and
// a statement that sets parked_at on a row in any other status is refused.
func TestParkedRowsAreQueued(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := newStore(t)
	key := job.Key{Tenant: "acme", ID: "parked-then-cancelled"}
	mustInsert(t, s, sampleJob(key.Tenant, key.ID))
	parked, err := s.Park(ctx, []job.Key{key})
	require.NoError(t, err)
	require.True(t, parked[0])

	_, err = s.Cancel(ctx, key)
	require.NoError(t, err)
	var parkedAt *time.Time
	require.NoError(t, pool.QueryRow(ctx, `SELECT parked_at FROM jobs WHERE tenant = $1 AND id = $2`, key.Tenant, key.ID).Scan(&parkedAt))
	assert.Nil(t, parkedAt, "a cancelled job is no longer parked")
	groups, err := s.ParkedGroups(ctx)
	require.NoError(t, err)
	assert.Empty(t, groups)

	_, err = pool.Exec(ctx, `UPDATE jobs SET parked_at = now() WHERE tenant = $1 AND id = $2`, key.Tenant, key.ID)
	assert.ErrorContains(t, err, "jobs_parked_queued")
}

// A job the caller asks to park is stored parked even with nothing parked
// in its group yet; the others of the batch are stored as usual.
func TestInsertParkedOnRequest(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newStore(t)
	jobs := []job.Job{sampleJob("acme", "over"), sampleJob("acme", "direct"), sampleJob("acme", "lane"), sampleJob("acme", "over")}
	res, err := s.InsertClaiming(ctx, jobs, store.Claiming{
		Claim: []bool{false, true, false, false}, Park: []bool{true, false, false, true}, Owner: "w1", Lease: time.Minute})
	require.NoError(t, err)
	assert.True(t, res[0].Created && res[0].Parked && !res[0].Claimed, "parked on request")
	assert.Nil(t, res[0].Record.EnqueuedAt, "a parked job gets no message")
	assert.True(t, res[1].Claimed && !res[1].Parked, "claimed")
	assert.False(t, res[2].Parked || res[2].Claimed, "published as usual")
	assert.NotNil(t, res[2].Record.EnqueuedAt)
	assert.False(t, res[3].Created, "a repeat of the batch's first")
	groups, err := s.ParkedGroups(ctx)
	require.NoError(t, err)
	assert.Equal(t, []store.ParkedGroup{{Tenant: "acme", Model: "qwen-plus", Lane: job.PriorityNormal}}, groups)
}
