package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
)

var shape = store.BatchShape{MaxJobs: 3, MaxBytes: 1 << 20, Window: time.Hour,
	LineBytes: func(m store.BatchMember) int { return len(m.Request) + 100 },
	Tokens:    func(store.BatchMember) int64 { return 10 }}

// batched stores n jobs of tenant and offloads each from a claim.
func batched(t *testing.T, s *store.Store, tenant string, n int) []job.Key {
	t.Helper()
	var keys []job.Key
	for i := range n {
		c := insertClaimed(t, s, sampleJob(tenant, fmt.Sprintf("b%02d", i)), "w1", time.Minute)
		ok, err := s.MarkBatched(context.Background(), c.AttemptOf("w1"))
		require.NoError(t, err)
		require.True(t, ok)
		keys = append(keys, c.Record.Key())
	}
	return keys
}

func resultWrites(t *testing.T, pool *pgxpool.Pool, tenant string) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM result_events WHERE tenant = $1`, tenant).Scan(&n))
	return n
}

// A batched job has no lease and no message; a duplicate message of it
// claims nothing; a batch takes the oldest waiting jobs up to its bounds,
// and each line's result is stored once, with its result event.
func TestBatchedJobsGoThroughABatchOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := newStore(t)
	keys := batched(t, s, "bt", 4)

	rec := mustGet(t, s, keys[0])
	assert.Equal(t, job.StatusBatched, rec.Status)
	assert.Empty(t, rec.LeaseOwner)
	assert.Nil(t, rec.EnqueuedAt)
	c, err := s.Claim(ctx, keys[0], "w2", time.Minute)
	require.NoError(t, err)
	assert.Equal(t, store.Batched, c.Outcome, "a duplicate message of a batched job claims nothing")
	stale, err := s.Unenqueued(ctx, 100)
	require.NoError(t, err)
	assert.Empty(t, stale, "the reconciler leaves batched jobs alone")
	_, err = pool.Exec(ctx, `UPDATE jobs SET enqueued_at = now() - interval '1 hour', lease_expires_at = NULL`)
	require.NoError(t, err)
	stale, err = s.Stale(ctx, job.PriorityNormal, time.Second, 100)
	require.NoError(t, err)
	assert.Empty(t, stale, "nor does its sweep of lost messages")

	n, oldest, err := s.WaitingBatched(ctx, "qwen-plus", 100)
	require.NoError(t, err)
	assert.Equal(t, 4, n)
	assert.False(t, oldest.IsZero())

	b, ok, err := s.FormBatch(ctx, "qwen-plus", shape)
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, 3, b.Jobs, "max_jobs bounds a batch")
	assert.Equal(t, store.BatchFormed, b.State)
	members, err := s.BatchMembers(ctx, b.ID)
	require.NoError(t, err)
	require.Len(t, members, 3)
	assert.Equal(t, keys[:3], []job.Key{members[0].Key, members[1].Key, members[2].Key})
	require.NotNil(t, mustGet(t, s, keys[0]).BatchID)
	assert.Equal(t, b.ID, *mustGet(t, s, keys[0]).BatchID, "a member names its batch")
	assert.Nil(t, mustGet(t, s, keys[3]).BatchID, "a job waiting to be gathered has none")

	require.NoError(t, s.AdvanceBatch(ctx, b.ID, store.BatchFormed, store.BatchUploaded, store.BatchRow{InputFileID: "file-1"}))
	require.ErrorIs(t, s.AdvanceBatch(ctx, b.ID, store.BatchFormed, store.BatchUploaded, store.BatchRow{InputFileID: "file-2"}), store.ErrBatchMoved)
	open, err := s.OpenBatches(ctx)
	require.NoError(t, err)
	require.Len(t, open, 1)
	assert.Equal(t, "file-1", open[0].InputFileID)

	items := []store.BatchedResult{{Key: keys[0], Result: result()}, {Key: keys[1], Result: result()}, {Key: keys[3], Result: result()}}
	done, err := s.CompleteBatched(ctx, b.ID, items)
	require.NoError(t, err)
	assert.Equal(t, []bool{true, true, false}, done, "a job of another batch (or none) is not completed")
	again, err := s.CompleteBatched(ctx, b.ID, items[:2])
	require.NoError(t, err)
	assert.Equal(t, []bool{false, false}, again, "a line stored twice is stored once")
	assert.Equal(t, 2, resultWrites(t, pool, "bt"))
	var calls int
	require.NoError(t, pool.QueryRow(ctx, `SELECT coalesce(sum(calls), 0) FROM usage_hours WHERE tenant = 'bt' AND model = 'qwen-plus@batch'`).Scan(&calls))
	assert.Equal(t, 2, calls, "a batch's calls count under the model's batch name")
	got := mustGet(t, s, keys[0])
	assert.Equal(t, job.StatusSucceeded, got.Status)
	assert.Equal(t, 1, got.Attempts)
}

// A job sent back online is retrying and due now, records a batch error
// (its attempt given back when nothing ran) and is claimable; a job near
// its deadline is found; a cancelled batched job stays cancelled.
func TestBatchedJobsSentOnline(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newStore(t)
	keys := batched(t, s, "bo", 3)
	_, err := s.Cancel(ctx, keys[2])
	require.NoError(t, err)

	back, err := s.SendOnline(ctx, []store.Unbatch{
		{Key: keys[0], Error: store.AttemptError{Message: "line failed", Code: "internal_error"}},
		{Key: keys[1], Error: store.AttemptError{Message: "batch expired"}, GiveBack: true},
		{Key: keys[2], Error: store.AttemptError{Message: "cancelled meanwhile"}},
	})
	require.NoError(t, err)
	require.Len(t, back, 2)
	assert.Equal(t, job.PriorityNormal, back[0].Lane)
	r0, r1 := mustGet(t, s, keys[0]), mustGet(t, s, keys[1])
	assert.Equal(t, job.StatusRetrying, r0.Status)
	assert.Equal(t, 1, r0.Attempts, "a failed line used its attempt")
	assert.Equal(t, 0, r1.Attempts, "an expired batch gives the attempt back")
	require.Len(t, r0.Errors, 1)
	assert.Equal(t, store.KindBatch, r0.Errors[0].Kind)
	assert.Equal(t, 1, r0.Errors[0].Attempt)
	assert.NotNil(t, r0.EnqueuedAt)
	assert.Equal(t, job.StatusCancelled, mustGet(t, s, keys[2]).Status)
	c, err := s.Claim(ctx, keys[0], "w2", time.Minute)
	require.NoError(t, err)
	assert.Equal(t, store.Claimed, c.Outcome)

	j := sampleJob("bo", "near")
	dl := time.Now().Add(time.Minute)
	j.Deadline = &dl
	cl := insertClaimed(t, s, j, "w1", time.Minute)
	ok, err := s.MarkBatched(ctx, cl.AttemptOf("w1"))
	require.NoError(t, err)
	require.True(t, ok)
	near, err := s.NearDeadline(ctx, "qwen-plus", time.Now().Add(2*time.Minute), 10)
	require.NoError(t, err)
	assert.Equal(t, []job.Key{j.Key()}, near)
	near, err = s.NearDeadline(ctx, "qwen-plus", time.Now(), 10)
	require.NoError(t, err)
	assert.Empty(t, near)
}
