package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/testsvc"
)

// Tests of the producer API's files (api_*.go). They use only testsvc and
// the exported API so they do not depend on the other test files' helpers.

func apiTestJob(tenant, id string) job.Job {
	return job.Job{ID: id, Tenant: tenant, Model: "qwen-plus", Priority: job.PriorityNormal,
		Request: json.RawMessage(`{"messages":[{"role":"user","content":"hi"}]}`)}
}

func TestInsertTxBatch(t *testing.T) {
	t.Parallel()
	s := store.New(testsvc.Postgres(t))
	ctx := context.Background()
	_, created, err := s.Insert(ctx, apiTestJob("acme", "old"))
	require.NoError(t, err)
	require.True(t, created)

	jobs := []job.Job{
		apiTestJob("acme", "b"),
		apiTestJob("acme", "old"), // exists
		apiTestJob("acme", "a"),   // publish fails
		apiTestJob("globex", "b"), // same id, other tenant
		apiTestJob("acme", "b"),   // repeats item 0
		apiTestJob("acme", "c"),   //
	}
	boom := errors.New("broker down")
	var published []string
	res, err := s.InsertTxBatch(ctx, jobs, func(ctx context.Context, created []int) []error {
		errs := make([]error, len(created))
		for n, i := range created {
			published = append(published, jobs[i].Tenant+"/"+jobs[i].ID)
			if jobs[i].ID == "a" {
				errs[n] = boom
			}
		}
		return errs
	})
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"acme/a", "acme/b", "acme/c", "globex/b"}, published, "each new key is published once")
	assert.True(t, res[0].Created)
	assert.Equal(t, job.StatusQueued, res[0].Record.Status)
	assert.False(t, res[1].Created)
	assert.Equal(t, "old", res[1].Record.ID)
	assert.False(t, res[2].Created)
	assert.ErrorIs(t, res[2].Err, boom)
	assert.True(t, res[3].Created)
	assert.False(t, res[4].Created, "a repeat is not created twice")
	assert.Equal(t, "b", res[4].Record.ID)
	assert.True(t, res[5].Created)

	_, err = s.Get(ctx, job.Key{Tenant: "acme", ID: "a"})
	assert.ErrorIs(t, err, store.ErrNotFound, "an unpublished job leaves nothing")
	for _, k := range []job.Key{{Tenant: "acme", ID: "b"}, {Tenant: "acme", ID: "c"}, {Tenant: "globex", ID: "b"}} {
		_, err := s.Get(ctx, k)
		assert.NoError(t, err, k)
	}

	// A failing transaction stores nothing.
	_, err = s.InsertTxBatch(ctx, []job.Job{apiTestJob("acme", "d")}, func(context.Context, []int) []error { return nil })
	require.Error(t, err, "publish must return one result per created job")
	_, err = s.Get(ctx, job.Key{Tenant: "acme", ID: "d"})
	assert.ErrorIs(t, err, store.ErrNotFound)
}

// The Record of a created job is built from the job, not read back: it
// must say what the row says.
func TestInsertTxBatchRecordMatchesRow(t *testing.T) {
	t.Parallel()
	s := store.New(testsvc.Postgres(t))
	ctx := context.Background()
	deadline := time.Now().Add(time.Hour).Truncate(time.Microsecond)
	full := apiTestJob("acme", "full")
	full.FallbackModels = []string{"qwen-max", "qwen-turbo"}
	full.Metadata = json.RawMessage(`{"team":"search","n":1}`)
	full.MaxAttempts = 7
	full.Priority = job.PriorityHigh
	full.Deadline = &deadline
	bare := apiTestJob("acme", "bare")
	bare.Priority = ""
	jobs := []job.Job{full, bare}
	res, err := s.InsertTxBatch(ctx, jobs, func(_ context.Context, created []int) []error {
		return make([]error, len(created))
	})
	require.NoError(t, err)
	for i, j := range jobs {
		require.True(t, res[i].Created, j.ID)
		got := res[i].Record
		row, err := s.Get(ctx, j.Key())
		require.NoError(t, err)
		assert.JSONEq(t, string(row.Request), string(got.Request), j.ID)
		if row.Metadata != nil || got.Metadata != nil {
			assert.JSONEq(t, string(row.Metadata), string(got.Metadata), j.ID)
		}
		got.Request, row.Request = nil, nil
		got.Metadata, row.Metadata = nil, nil
		assert.Equal(t, row, got, j.ID)
	}
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
