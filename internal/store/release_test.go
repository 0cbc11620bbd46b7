package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/job"
)

// ReleaseBatch hands back, in one statement, the jobs the owner holds, each
// with its attempt given back, and leaves alone a job another replica
// holds, one that finished, and a key with no row.
func TestReleaseBatch(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := context.Background()
	mine1, mine2 := sampleJob("acme", "rb-mine-1"), sampleJob("globex", "rb-mine-2")
	theirs, done := sampleJob("acme", "rb-theirs"), sampleJob("acme", "rb-done")
	insertClaimed(t, s, mine1, "w1", time.Minute)
	insertClaimed(t, s, mine2, "w1", time.Minute)
	insertClaimed(t, s, theirs, "w2", time.Minute)
	c := insertClaimed(t, s, done, "w1", time.Minute)
	ok, err := s.Complete(ctx, c.AttemptOf("w1"), result())
	require.NoError(t, err)
	require.True(t, ok)

	keys := []job.Key{mine1.Key(), theirs.Key(), done.Key(), {Tenant: "acme", ID: "rb-missing"}, mine2.Key()}
	released, err := s.ReleaseBatch(ctx, keys, "w1")
	require.NoError(t, err)
	assert.Equal(t, []bool{true, false, false, false, true}, released)
	for _, j := range []job.Job{mine1, mine2} {
		rec := mustGet(t, s, j.Key())
		assert.Equal(t, job.StatusQueued, rec.Status, j.ID)
		assert.Zero(t, rec.Attempts, "%s: the attempt that never reached the provider is given back", j.ID)
		assert.Empty(t, rec.LeaseOwner, j.ID)
	}
	assert.Equal(t, job.StatusRunning, mustGet(t, s, theirs.Key()).Status, "another replica's job is not touched")
	assert.Equal(t, job.StatusSucceeded, mustGet(t, s, done.Key()).Status)

	none, err := s.ReleaseBatch(ctx, nil, "w1")
	require.NoError(t, err)
	assert.Empty(t, none)
}
