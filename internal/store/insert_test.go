package store_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/testsvc"
)

// Tests of InsertBatch and Unsubmit: the API's and the ingester's path into
// the store.

func TestInsertBatch(t *testing.T) {
	t.Parallel()
	s := store.New(testsvc.Postgres(t))
	ctx := context.Background()
	old, created, err := s.Insert(ctx, apiTestJob("acme", "old"))
	require.NoError(t, err)
	require.True(t, created)

	resent := apiTestJob("acme", "old") // exists, with another request
	resent.Request = json.RawMessage(`{"messages":[{"role":"user","content":"changed"}]}`)
	jobs := []job.Job{
		apiTestJob("acme", "b"),
		resent,
		apiTestJob("acme", "a"),
		apiTestJob("globex", "b"), // same id, other tenant
		apiTestJob("acme", "b"),   // repeats item 0
		apiTestJob("acme", "c"),
	}
	res, err := s.InsertBatch(ctx, jobs)
	require.NoError(t, err)
	require.Len(t, res, len(jobs))

	wantCreated := []bool{true, false, true, true, false, true}
	for i, j := range jobs {
		r := res[i]
		assert.Equal(t, wantCreated[i], r.Created, "item %d (%s/%s)", i, j.Tenant, j.ID)
		assert.Equal(t, j.Key(), r.Record.Key(), "item %d", i)
		assert.Equal(t, job.StatusQueued, r.Record.Status, "item %d", i)
		assert.NotNil(t, r.Record.EnqueuedAt, "item %d: enqueued_at is set (the caller publishes right after)", i)
	}
	// A re-submission pins a job still queued and untouched, so that its
	// creator's take-back keeps it (Unsubmit): updated_at moves, nothing else.
	pinned := mustGet(t, s, old.Key())
	assert.True(t, pinned.UpdatedAt.After(old.UpdatedAt), "the re-submission pinned the job")
	old.UpdatedAt = pinned.UpdatedAt
	assert.Equal(t, old, res[1].Record, "an existing key returns the existing row unchanged")
	assert.Equal(t, old, pinned, "the existing row is not overwritten")
	assert.Equal(t, res[0].Record, res[4].Record, "a repeat reports the first occurrence's record")

	for _, k := range []job.Key{{Tenant: "acme", ID: "a"}, {Tenant: "acme", ID: "b"}, {Tenant: "acme", ID: "c"}, {Tenant: "globex", ID: "b"}} {
		rec := mustGet(t, s, k)
		require.NotNil(t, rec.EnqueuedAt, k)
		assert.Equal(t, rec.CreatedAt, *rec.EnqueuedAt, "%v: enqueued_at = now() of the insert", k)
	}
	recs, _, err := s.List(ctx, store.ListFilter{Tenant: "acme"})
	require.NoError(t, err)
	assert.Len(t, recs, 4, "old, a, b, c: the repeat is stored once")

	// Inserting the same batch again creates nothing.
	again, err := s.InsertBatch(ctx, jobs)
	require.NoError(t, err)
	for i := range jobs {
		assert.False(t, again[i].Created, "item %d", i)
		assert.Equal(t, mustGet(t, s, jobs[i].Key()), again[i].Record, "item %d", i)
	}

	empty, err := s.InsertBatch(ctx, nil)
	require.NoError(t, err)
	assert.Empty(t, empty)
}

// InsertBatch is one statement: a job the database refuses fails the whole
// batch, and nothing of it is stored.
func TestInsertBatchIsOneStatement(t *testing.T) {
	t.Parallel()
	s := store.New(testsvc.Postgres(t))
	ctx := context.Background()
	bad := apiTestJob("acme", "bad")
	bad.Request = json.RawMessage(`["not", "an", "object"]`) // jobs_request_object
	_, err := s.InsertBatch(ctx, []job.Job{apiTestJob("acme", "good"), bad})
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	assert.Equal(t, "23514", pgErr.Code, "check_violation")
	for _, id := range []string{"good", "bad"} {
		_, err := s.Get(ctx, job.Key{Tenant: "acme", ID: id})
		assert.ErrorIs(t, err, store.ErrNotFound, id)
	}
}

// The Record of a created job is built from the job, not read back: it
// must say what the row says.
func TestInsertBatchRecordMatchesRow(t *testing.T) {
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
	bare := apiTestJob("", "bare")
	bare.Priority = ""
	jobs := []job.Job{full, bare}
	res, err := s.InsertBatch(ctx, jobs)
	require.NoError(t, err)
	for i, j := range jobs {
		require.True(t, res[i].Created, j.ID)
		got := res[i].Record
		j.Normalize()
		row := mustGet(t, s, j.Key())
		assert.JSONEq(t, string(row.Request), string(got.Request), j.ID)
		if row.Metadata != nil || got.Metadata != nil {
			assert.JSONEq(t, string(row.Metadata), string(got.Metadata), j.ID)
		}
		got.Request, row.Request = nil, nil
		got.Metadata, row.Metadata = nil, nil
		assert.Equal(t, row, got, j.ID)
	}
	assert.Equal(t, job.DefaultTenant, res[1].Record.Tenant)
	assert.Equal(t, job.PriorityNormal, res[1].Record.Priority)
	assert.Equal(t, job.DefaultMaxAttempts, res[1].Record.MaxAttempts)
}

// Unsubmit takes back jobs whose message could not be published: only a
// job that is still queued, was never claimed and was never answered to a
// re-submission is deleted; every other key is returned as kept.
func TestUnsubmit(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t)
	ctx := context.Background()
	type tc struct {
		id      string
		prepare func(t *testing.T, j job.Job) // nil: inserted, left queued
		deleted bool
	}
	claim := func(t *testing.T, j job.Job) { insertClaimed(t, s, j, "w1", time.Minute) }
	cases := []tc{
		{id: "never-claimed", deleted: true},
		{id: "never-claimed-2", deleted: true},
		{id: "running", prepare: claim},
		{id: "released", prepare: func(t *testing.T, j job.Job) {
			// Back to queued with attempts 0, but a worker held it once.
			claim(t, j)
			ok, err := s.Release(ctx, j.Key(), "w1")
			require.NoError(t, err)
			require.True(t, ok)
		}},
		{id: "retrying", prepare: func(t *testing.T, j job.Job) {
			claim(t, j)
			ok, err := s.ScheduleRetry(ctx, store.Attempt{Key: j.Key(), Owner: "w1", N: 1}, time.Now().Add(time.Hour), attemptErr("server_error"))
			require.NoError(t, err)
			require.True(t, ok)
		}},
		{id: "succeeded", prepare: func(t *testing.T, j job.Job) {
			mustInsert(t, s, j)
			forceStatus(t, pool, j.Key(), job.StatusSucceeded)
		}},
		{id: "cancelled", prepare: func(t *testing.T, j job.Job) {
			mustInsert(t, s, j)
			_, err := s.Cancel(ctx, j.Key())
			require.NoError(t, err)
		}},
		{id: "resubmitted", prepare: func(t *testing.T, j job.Job) {
			// A re-submission was answered with it: it pinned the job.
			mustInsert(t, s, j)
			res, err := s.InsertBatch(ctx, []job.Job{j})
			require.NoError(t, err)
			require.False(t, res[0].Created)
		}},
		{id: "resubmitted-over-backpressure", prepare: func(t *testing.T, j job.Job) {
			mustInsert(t, s, j)
			_, err := s.Resubmitted(ctx, j.Key())
			require.NoError(t, err)
		}},
		{id: "missing", prepare: func(*testing.T, job.Job) {}}, // no row: nothing to delete
	}
	var keys, wantKept []job.Key
	before := map[job.Key]store.Record{}
	for _, c := range cases {
		j := sampleJob("acme", c.id)
		if c.prepare == nil {
			mustInsert(t, s, j)
		} else {
			c.prepare(t, j)
		}
		keys = append(keys, j.Key())
		if !c.deleted {
			wantKept = append(wantKept, j.Key())
		}
		if rec, err := s.Get(ctx, j.Key()); err == nil {
			before[j.Key()] = rec
		}
	}
	// The same id of another tenant is not touched.
	other := mustInsert(t, s, sampleJob("globex", "never-claimed"))

	kept, err := s.Unsubmit(ctx, keys)
	require.NoError(t, err)
	assert.Equal(t, wantKept, kept, "kept keys, in the order given")
	for _, c := range cases {
		k := job.Key{Tenant: "acme", ID: c.id}
		rec, err := s.Get(ctx, k)
		if c.deleted || c.id == "missing" {
			assert.ErrorIs(t, err, store.ErrNotFound, c.id)
			continue
		}
		require.NoError(t, err, c.id)
		assert.Equal(t, before[k], rec, "%s: a kept job is unchanged", c.id)
	}
	assert.Equal(t, other, mustGet(t, s, other.Key()))

	kept, err = s.Unsubmit(ctx, nil)
	require.NoError(t, err)
	assert.Empty(t, kept)
}
