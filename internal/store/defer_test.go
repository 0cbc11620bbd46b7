package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
)

// A rate-limited attempt is given back: a job throttled more often than
// max_attempts is still claimable, and the database accepts a retrying job
// whose only attempt was refunded.
func TestDeferRateLimitedGivesTheAttemptBack(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := context.Background()
	j := sampleJob("t1", "throttled")
	j.MaxAttempts = 1
	mustInsert(t, s, j)
	for i := range 3 {
		c, err := s.Claim(ctx, j.Key(), "w1", time.Minute)
		require.NoError(t, err)
		require.Equal(t, store.Claimed, c.Outcome, "round %d", i)
		require.Equal(t, 1, c.Attempt)
		ok, err := s.DeferRateLimited(ctx, c.AttemptOf("w1"), time.Now().Add(-time.Millisecond),
			store.AttemptError{Attempt: c.Attempt, Kind: "rate_limit_tokens", Message: "429", At: time.Now()})
		require.NoError(t, err)
		require.True(t, ok)
		rec, err := s.Get(ctx, j.Key())
		require.NoError(t, err)
		require.Equal(t, job.StatusRetrying, rec.Status)
		require.Zero(t, rec.Attempts)
		require.Len(t, rec.Errors, i+1)
	}
	// A plain failure does count: the single attempt is then used up.
	c, err := s.Claim(ctx, j.Key(), "w1", time.Minute)
	require.NoError(t, err)
	ok, err := s.ScheduleRetry(ctx, c.AttemptOf("w1"), time.Now(), store.AttemptError{Attempt: 1, Kind: "server", Message: "500", At: time.Now()})
	require.NoError(t, err)
	require.True(t, ok)
	rec, err := s.Get(ctx, j.Key())
	require.NoError(t, err)
	require.Equal(t, 1, rec.Attempts)
	// A stale owner cannot defer.
	ok, err = s.DeferRateLimited(ctx, store.Attempt{Key: j.Key(), Owner: "w2", N: 1}, time.Now(), store.AttemptError{Attempt: 1, Kind: "rate_limit", Message: "429", At: time.Now()})
	require.NoError(t, err)
	require.False(t, ok)
}
