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

func TestAttemptLogRecordsEveryAttempt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := newStore(t)
	j := sampleJob("acme", "timeline")
	c := insertClaimed(t, s, j, "w1", time.Minute)

	// Attempt 1: a 429 on the job's model, deferred.
	claimed := time.Now().Add(-3 * time.Second).UTC().Round(time.Microsecond)
	start, end := claimed.Add(time.Second), claimed.Add(2*time.Second)
	ae := attemptErr("rate_limit_tokens")
	ae.Call = store.CallRateLimited
	ae.Trace = store.Trace{ClaimedAt: claimed, CallStartedAt: start, CallEndedAt: end, HTTPStatus: 429}
	ok, err := s.DeferRateLimited(ctx, c.AttemptOf("w1"), time.Now().Add(-time.Millisecond), ae)
	require.NoError(t, err)
	require.True(t, ok)

	// Attempt 2 (a fallback model) takes the lease, then loses it.
	c2, err := s.Claim(ctx, j.Key(), "w2", time.Minute)
	require.NoError(t, err)
	require.Equal(t, store.Claimed, c2.Outcome)
	expireLease(t, pool, j.Key())

	// Attempt 3 takes over and succeeds on the fallback.
	c3, err := s.Claim(ctx, j.Key(), "w3", time.Minute)
	require.NoError(t, err)
	require.Equal(t, store.Claimed, c3.Outcome)
	res := result()
	res.ModelUsed = "qwen-flash"
	res.Trace = store.Trace{CallStartedAt: time.Now(), CallEndedAt: time.Now(), HTTPStatus: 200}
	oks, err := s.CompleteBatch(ctx, []store.Completion{{Attempt: c3.AttemptOf("w3"), Result: res}})
	require.NoError(t, err)
	require.Equal(t, []bool{true}, oks)

	log, err := s.AttemptLog(ctx, j.Key())
	require.NoError(t, err)
	require.Len(t, log, 3)
	first := log[0]
	assert.Equal(t, 1, first.Attempt)
	assert.Equal(t, store.OutcomeRateLimited, first.Outcome)
	assert.Equal(t, "rate_limit_tokens", first.Kind)
	assert.Equal(t, 429, first.HTTPStatus)
	assert.Equal(t, "qwen-plus", first.Model)
	assert.Equal(t, "rate_limit_tokens happened", first.Message)
	require.NotNil(t, first.ClaimedAt)
	require.NotNil(t, first.StartedAt)
	assert.True(t, first.ClaimedAt.Equal(claimed), "claimed_at %s, want %s", first.ClaimedAt, claimed)
	assert.True(t, first.StartedAt.Equal(start))
	assert.True(t, first.EndedAt.Equal(end))

	// The rate-limited attempt was given back, so the takeover's number
	// is the one the expired claim held.
	assert.Equal(t, store.OutcomeLeaseExpired, log[1].Outcome)
	assert.Equal(t, c2.Attempt, log[1].Attempt)
	assert.False(t, log[1].EndedAt.IsZero())

	last := log[2]
	assert.Equal(t, store.OutcomeSucceeded, last.Outcome)
	assert.Equal(t, c3.Attempt, last.Attempt)
	assert.Equal(t, "qwen-flash", last.Model)
	assert.Equal(t, 200, last.HTTPStatus)
	assert.Equal(t, 10, last.PromptTokens)
	assert.Equal(t, 5, last.CompletionTokens)

	// The error history, which the retry policy counts, holds only the 429.
	rec := mustGet(t, s, j.Key())
	require.Len(t, rec.Errors, 1)
	assert.Equal(t, "rate_limit_tokens", rec.Errors[0].Kind)
}

func TestAttemptLogEndsAttemptsThatEndWithoutTheirWorker(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newStore(t)

	// Cancelled while running: the cancel ends the attempt.
	running := sampleJob("acme", "cancel-running")
	insertClaimed(t, s, running, "w1", time.Minute)
	_, err := s.Cancel(ctx, running.Key())
	require.NoError(t, err)
	log, err := s.AttemptLog(ctx, running.Key())
	require.NoError(t, err)
	require.Len(t, log, 1)
	assert.Equal(t, store.OutcomeCancelled, log[0].Outcome)
	assert.Equal(t, 1, log[0].Attempt)
	assert.WithinDuration(t, time.Now(), log[0].EndedAt, time.Minute)

	// Cancelled while queued: no attempt to end.
	queued := sampleJob("acme", "cancel-queued")
	mustInsert(t, s, queued)
	_, err = s.Cancel(ctx, queued.Key())
	require.NoError(t, err)
	log, err = s.AttemptLog(ctx, queued.Key())
	require.NoError(t, err)
	assert.Empty(t, log)

	// A permanent failure and a dead job each leave their entry.
	failed := sampleJob("acme", "failed")
	c := insertClaimed(t, s, failed, "w1", time.Minute)
	ae := attemptErr("client")
	ae.Call = store.CallFailed
	ae.Trace.HTTPStatus = 400
	ok, err := s.Fail(ctx, c.AttemptOf("w1"), ae)
	require.NoError(t, err)
	require.True(t, ok)
	log, err = s.AttemptLog(ctx, failed.Key())
	require.NoError(t, err)
	require.Len(t, log, 1)
	assert.Equal(t, "client", log[0].Outcome)
	assert.Equal(t, 400, log[0].HTTPStatus)
	assert.Nil(t, log[0].StartedAt, "no call time was given")

	_, err = s.AttemptLog(ctx, job.Key{Tenant: "globex", ID: "failed"})
	assert.ErrorIs(t, err, store.ErrNotFound)
}
