package store_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/testsvc"
)

// Tests of the read-only queries the producer API uses.

func apiTestJob(tenant, id string) job.Job {
	return job.Job{ID: id, Tenant: tenant, Model: "qwen-plus", Priority: job.PriorityNormal,
		Request: json.RawMessage(`{"messages":[{"role":"user","content":"hi"}]}`)}
}

func TestAPIQueries(t *testing.T) {
	t.Parallel()
	s := store.New(testsvc.Postgres(t))
	ctx := context.Background()
	require.NoError(t, s.Ping(ctx))

	rate, err := s.DrainRate(ctx, time.Minute)
	require.NoError(t, err)
	assert.Zero(t, rate)
	for _, id := range []string{"x", "y", "z"} {
		_, _, err := s.Insert(ctx, apiTestJob("acme", id))
		require.NoError(t, err)
	}
	for _, id := range []string{"x", "y"} {
		_, err := s.Cancel(ctx, job.Key{Tenant: "acme", ID: id})
		require.NoError(t, err)
	}
	rate, err = s.DrainRate(ctx, time.Minute)
	require.NoError(t, err)
	assert.InDelta(t, 2.0/60, rate, 1e-9)
	_, err = s.DrainRate(ctx, 0)
	require.Error(t, err)

	id, err := s.RecordDeadLetter(ctx, store.DeadLetterRow{Tenant: "acme", JobID: "z", Lane: "normal", Reason: "r", Body: []byte(`{}`)})
	require.NoError(t, err)
	dl, err := s.GetDeadLetter(ctx, "acme", id)
	require.NoError(t, err)
	assert.Equal(t, "z", dl.JobID)
	_, err = s.GetDeadLetter(ctx, "globex", id)
	assert.ErrorIs(t, err, store.ErrNotFound, "another tenant's dead letter is not found")
	dl2, err := s.GetDeadLetter(ctx, "acme", id)
	require.NoError(t, err)
	assert.Equal(t, dl, dl2, "get does not remove")
}
