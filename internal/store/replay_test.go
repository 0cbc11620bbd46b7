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
)

// deadLetterID returns the id of the one dead letter of kind job of key.
func deadLetterID(t testing.TB, s *store.Store, key job.Key) int64 {
	t.Helper()
	var ids []int64
	for _, d := range deadLetters(t, s, key.Tenant) {
		if d.Kind == store.DeadLetterJob && d.JobID == key.ID {
			ids = append(ids, d.ID)
		}
	}
	require.Len(t, ids, 1, "dead letters of %v", key)
	return ids[0]
}

func TestReplayDeadLetterOfDeadJob(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newStore(t)
	j := sampleJob("acme", "exhausted")
	c := insertClaimed(t, s, j, "w1", time.Minute)
	ok, err := s.MarkDeadLettered(ctx, c.AttemptOf("w1"), attemptErr("server_error"), deadLetterOf(j.Key()))
	require.NoError(t, err)
	require.True(t, ok)
	dead := mustGet(t, s, j.Key())
	id := deadLetterID(t, s, j.Key())
	dl, err := s.GetDeadLetter(ctx, "acme", id)
	require.NoError(t, err)

	res, err := s.ReplayDeadLetter(ctx, "acme", id, nil)
	require.NoError(t, err)
	assert.Equal(t, dl, res.DeadLetter)
	require.NotNil(t, res.Job)
	got := *res.Job
	assert.Equal(t, mustGet(t, s, j.Key()), got, "the returned job is the row")
	assert.Equal(t, job.StatusQueued, got.Status)
	assert.Zero(t, got.Attempts)
	assert.Nil(t, got.EnqueuedAt, "no message yet: the caller publishes, or the reconciler")
	assert.Nil(t, got.CompletedAt)
	assert.Nil(t, got.StartedAt)
	assert.Empty(t, got.ModelUsed)
	assert.Equal(t, dead.Errors, got.Errors, "the error history is kept")
	assert.JSONEq(t, string(j.Request), string(got.Request), "the stored job is kept without a replacement")
	assert.Equal(t, dead.Job.Model, got.Model)
	assert.Equal(t, dead.MaxAttempts, got.MaxAttempts)
	_, err = s.GetDeadLetter(ctx, "acme", id)
	assert.ErrorIs(t, err, store.ErrNotFound, "the dead letter is deleted")

	// The replayed job runs again.
	c, err = s.Claim(ctx, j.Key(), "w2", time.Minute)
	require.NoError(t, err)
	assert.Equal(t, store.Claimed, c.Outcome)
	assert.Equal(t, 1, c.Attempt)

	_, err = s.ReplayDeadLetter(ctx, "acme", id, nil)
	assert.ErrorIs(t, err, store.ErrNotFound, "replayed once")
}

// A job that failed at intake holds a placeholder; the caller re-parsed its
// dead letter's body and replays it with the replacement.
func TestReplayDeadLetterWithReplacement(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newStore(t)
	body := []byte(`{"id": "fixed", "tenant": "acme", "model": "qwen-plus", "request": 42}`)
	out, err := s.RecordIntakeFailure(ctx, store.IntakeFailure{Tenant: "acme", ID: "fixed", Model: "qwen-plus",
		Lane: job.PriorityNormal, Reason: "request: must be an object", Body: body})
	require.NoError(t, err)
	require.Equal(t, store.IntakeJobFailed, out)
	key := job.Key{Tenant: "acme", ID: "fixed"}
	failed := mustGet(t, s, key)
	id := deadLetterID(t, s, key)

	deadline := time.Now().Add(time.Hour).UTC().Truncate(time.Microsecond)
	repl := job.Job{ID: "fixed", Tenant: "acme", Model: "qwen-max", FallbackModels: []string{"qwen-flash", "qwen-turbo"},
		Priority: job.PriorityHigh, Request: json.RawMessage(`{"messages": [{"role": "user", "content": "fixed"}]}`),
		Metadata: json.RawMessage(`{"replayed": true}`), MaxAttempts: 9, Deadline: &deadline}
	res, err := s.ReplayDeadLetter(ctx, "acme", id, &repl)
	require.NoError(t, err)
	require.NotNil(t, res.Job)
	got := mustGet(t, s, key)
	assert.Equal(t, got, *res.Job)
	assert.Equal(t, job.StatusQueued, got.Status)
	assert.Zero(t, got.Attempts)
	assert.Nil(t, got.EnqueuedAt)
	assert.Equal(t, "qwen-max", got.Model)
	assert.Equal(t, []string{"qwen-flash", "qwen-turbo"}, got.FallbackModels)
	assert.Equal(t, job.PriorityHigh, got.Priority)
	assert.JSONEq(t, string(repl.Request), string(got.Request))
	assert.JSONEq(t, string(repl.Metadata), string(got.Metadata))
	assert.Equal(t, 9, got.MaxAttempts)
	require.NotNil(t, got.Deadline)
	assert.True(t, deadline.Equal(*got.Deadline))
	assert.Equal(t, failed.Errors, got.Errors, "the intake error stays in the history")
	assert.Equal(t, failed.CreatedAt, got.CreatedAt)
	_, err = s.GetDeadLetter(ctx, "acme", id)
	assert.ErrorIs(t, err, store.ErrNotFound)
}

// A message (kind message) is not a job llmq holds: replay changes nothing,
// the caller re-publishes the body and then takes the dead letter.
func TestReplayDeadLetterOfMessage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newStore(t)
	for _, f := range []store.IntakeFailure{
		{Tenant: "acme", Reason: "malformed", Body: []byte(`{"tenant": "acme"`)},                         // no id
		{Tenant: "acme", ID: "taken", Reason: "model: unknown", Body: []byte(`{"id": "taken", "v": 2}`)}, // conflict
	} {
		if f.ID != "" {
			mustInsert(t, s, sampleJob("acme", f.ID))
		}
		_, err := s.RecordIntakeFailure(ctx, f)
		require.NoError(t, err)
	}
	taken := mustGet(t, s, job.Key{Tenant: "acme", ID: "taken"})
	dls := deadLetters(t, s, "acme")
	require.Len(t, dls, 2)
	for _, dl := range dls {
		require.Equal(t, store.DeadLetterMessage, dl.Kind)
		res, err := s.ReplayDeadLetter(ctx, "acme", dl.ID, nil)
		require.NoError(t, err)
		assert.Equal(t, dl, res.DeadLetter)
		assert.Nil(t, res.Job)
		kept, err := s.GetDeadLetter(ctx, "acme", dl.ID)
		require.NoError(t, err)
		assert.Equal(t, dl, kept, "the dead letter stays until the caller takes it")
	}
	assert.Equal(t, taken, mustGet(t, s, taken.Key()), "the job of a conflicting message is untouched")
}

func TestReplayDeadLetterRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := newStore(t)
	j := sampleJob("acme", "dead")
	mustInsert(t, s, j)
	forceStatus(t, pool, j.Key(), job.StatusDead)
	id, err := s.RecordDeadLetter(ctx, deadLetterOf(j.Key()))
	require.NoError(t, err)
	before := mustGet(t, s, j.Key())

	_, err = s.ReplayDeadLetter(ctx, "globex", id, nil)
	assert.ErrorIs(t, err, store.ErrNotFound, "another tenant's dead letter")
	_, err = s.ReplayDeadLetter(ctx, "acme", id+1000, nil)
	assert.ErrorIs(t, err, store.ErrNotFound, "an unknown dead letter")
	assert.Equal(t, before, mustGet(t, s, j.Key()))
	_, err = s.GetDeadLetter(ctx, "acme", id)
	require.NoError(t, err)

	// A job in a status replay cannot move: the transaction changes nothing.
	for _, st := range []job.Status{job.StatusQueued, job.StatusRunning, job.StatusRetrying, job.StatusSucceeded, job.StatusCancelled} {
		k := job.Key{Tenant: "acme", ID: "in-" + string(st)}
		mustInsert(t, s, sampleJob(k.Tenant, k.ID))
		forceStatus(t, pool, k, st)
		before := mustGet(t, s, k)
		id, err := s.RecordDeadLetter(ctx, deadLetterOf(k))
		require.NoError(t, err)
		repl := sampleJob(k.Tenant, k.ID)
		repl.Model = "replacement"
		_, err = s.ReplayDeadLetter(ctx, k.Tenant, id, &repl)
		var te *job.TransitionError
		require.ErrorAs(t, err, &te, st)
		assert.Equal(t, st, te.From)
		assert.Equal(t, job.StatusQueued, te.To)
		assert.Equal(t, before, mustGet(t, s, k), "%s: the job is unchanged", st)
		_, err = s.GetDeadLetter(ctx, k.Tenant, id)
		assert.NoError(t, err, "%s: the dead letter is kept", st)
	}
}
