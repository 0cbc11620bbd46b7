package store_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
)

// RecordIntakeFailure's four outcomes, in the order an ingester meets them.
func TestRecordIntakeFailure(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newStore(t)

	// 1. No id could be read: a dead letter of kind message only, under the
	// default tenant and the normal lane when none was read.
	unreadable := []byte("{not json")
	out, err := s.RecordIntakeFailure(ctx, store.IntakeFailure{Reason: "malformed: not JSON", Body: unreadable})
	require.NoError(t, err)
	assert.Equal(t, store.IntakeMessageOnly, out)
	dls := deadLetters(t, s, job.DefaultTenant)
	require.Len(t, dls, 1)
	assert.Equal(t, store.DeadLetterMessage, dls[0].Kind)
	assert.Empty(t, dls[0].JobID)
	assert.Equal(t, string(job.PriorityNormal), dls[0].Lane)
	assert.Equal(t, unreadable, dls[0].Body)
	recs, _, err := s.List(ctx, store.ListFilter{Tenant: job.DefaultTenant})
	require.NoError(t, err)
	assert.Empty(t, recs, "no job row without an id")

	// 2. The id is free: a failed job row with a placeholder request, and
	// the body as its dead letter (kind job).
	body := []byte(`{"id": "bad-1", "tenant": "acme", "model": "gpt-nope", "request": 42}`)
	f := store.IntakeFailure{Tenant: "acme", ID: "bad-1", Model: "gpt-nope", Lane: job.PriorityHigh,
		Reason: "request: must be an object", Body: body}
	out, err = s.RecordIntakeFailure(ctx, f)
	require.NoError(t, err)
	assert.Equal(t, store.IntakeJobFailed, out)
	key := job.Key{Tenant: "acme", ID: "bad-1"}
	rec := mustGet(t, s, key)
	assert.Equal(t, job.StatusFailed, rec.Status)
	assert.JSONEq(t, `{}`, string(rec.Request), "placeholder request")
	assert.Equal(t, "gpt-nope", rec.Model)
	assert.Equal(t, job.PriorityHigh, rec.Priority)
	assert.Zero(t, rec.Attempts)
	require.NotNil(t, rec.CompletedAt)
	assert.Nil(t, rec.EnqueuedAt, "no message exists for it")
	require.Len(t, rec.Errors, 1)
	assert.Equal(t, "invalid", rec.Errors[0].Kind)
	assert.Equal(t, f.Reason, rec.Errors[0].Message)
	assert.Equal(t, "gpt-nope", rec.Errors[0].Model)
	dls = deadLetters(t, s, "acme")
	require.Len(t, dls, 1)
	jobDL := dls[0]
	assert.Equal(t, store.DeadLetterJob, jobDL.Kind)
	assert.Equal(t, "bad-1", jobDL.JobID)
	assert.Equal(t, f.Reason, jobDL.Reason)
	assert.Equal(t, string(job.PriorityHigh), jobDL.Lane)
	assert.Equal(t, body, jobDL.Body)

	// 3. The same message again (a redelivery): nothing new.
	out, err = s.RecordIntakeFailure(ctx, f)
	require.NoError(t, err)
	assert.Equal(t, store.IntakeDuplicate, out)
	assert.Equal(t, []store.DeadLetterRow{jobDL}, deadLetters(t, s, "acme"))
	assert.Equal(t, rec, mustGet(t, s, key))

	// 4. Another message for a taken id: a dead letter of kind message with
	// the conflict in its reason; the job is untouched. A stored job of the
	// API conflicts the same way, and every conflicting message is kept.
	good := mustInsert(t, s, sampleJob("acme", "good"))
	conflicts := []store.IntakeFailure{
		{Tenant: "acme", ID: "bad-1", Reason: "model: unknown", Body: []byte(`{"id": "bad-1", "tenant": "acme", "v": 2}`)},
		{Tenant: "acme", ID: "bad-1", Reason: "model: unknown", Body: []byte(`{"id": "bad-1", "tenant": "acme", "v": 3}`)},
		{Tenant: "acme", ID: "good", Reason: "request: must be an object", Body: []byte(`{"id": "good", "tenant": "acme"}`)},
		{Tenant: "acme", ID: "good", Reason: "request: must be an object", Body: []byte(`{"id": "good", "tenant": "acme"}`)},
	}
	for i, c := range conflicts {
		out, err := s.RecordIntakeFailure(ctx, c)
		require.NoError(t, err, i)
		assert.Equal(t, store.IntakeConflict, out, i)
	}
	assert.Equal(t, rec, mustGet(t, s, key), "the failed job is untouched")
	assert.Equal(t, good, mustGet(t, s, good.Key()), "the stored job is untouched")
	dls = deadLetters(t, s, "acme")
	require.Len(t, dls, 1+len(conflicts), "one row per conflicting message")
	assert.Equal(t, jobDL, dls[0], "the job's dead letter is untouched")
	for i, c := range conflicts {
		d := dls[1+i]
		assert.Equal(t, store.DeadLetterMessage, d.Kind, i)
		assert.Equal(t, c.ID, d.JobID, i)
		assert.True(t, strings.HasPrefix(d.Reason, store.ReasonConflict), "reason %q", d.Reason)
		assert.Contains(t, d.Reason, c.Reason, i)
		assert.Equal(t, c.Body, d.Body, i)
	}

	// The failure of another tenant with the same id is its own.
	out, err = s.RecordIntakeFailure(ctx, store.IntakeFailure{Tenant: "globex", ID: "bad-1", Reason: "r", Body: body})
	require.NoError(t, err)
	assert.Equal(t, store.IntakeJobFailed, out)
}
