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

func TestDeadLetters(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newStore(t)

	// A malformed message: no job id, no tenant, body kept byte for byte.
	body := []byte{'{', 0xff, 0x00, '"', 'x'}
	malformed, err := s.RecordDeadLetter(ctx, store.DeadLetterRow{Lane: "normal", Reason: "malformed: invalid UTF-8", Body: body})
	require.NoError(t, err)

	first := time.Now().Add(-time.Hour).UTC().Truncate(time.Microsecond)
	id, err := s.RecordDeadLetter(ctx, store.DeadLetterRow{Tenant: "acme", JobID: "j1", Lane: "high",
		Reason: "attempts exhausted", Attempts: 3, LastError: "429", Body: []byte(`{"id":"j1"}`), FirstFailedAt: first})
	require.NoError(t, err)
	// The same job dead-lettered again keeps its row.
	again, err := s.RecordDeadLetter(ctx, store.DeadLetterRow{Tenant: "acme", JobID: "j1", Lane: "high",
		Reason: "deadline passed", Attempts: 4, LastError: "timeout", Body: []byte(`{"id":"j1","v":2}`)})
	require.NoError(t, err)
	assert.Equal(t, id, again)

	for i := range 5 {
		_, err := s.RecordDeadLetter(ctx, store.DeadLetterRow{Tenant: "acme", JobID: fmt.Sprintf("k%d", i), Lane: "low",
			Reason: "failed", Body: []byte("{}")})
		require.NoError(t, err)
	}

	def, next, err := s.ListDeadLetters(ctx, job.DefaultTenant, "", 0)
	require.NoError(t, err)
	assert.Empty(t, next)
	require.Len(t, def, 1)
	assert.Equal(t, malformed, def[0].ID)
	assert.Equal(t, body, def[0].Body)
	assert.Empty(t, def[0].JobID)

	var all []store.DeadLetterRow
	cursor := ""
	for {
		page, next, err := s.ListDeadLetters(ctx, "acme", cursor, 2)
		require.NoError(t, err)
		all = append(all, page...)
		if next == "" {
			break
		}
		cursor = next
	}
	require.Len(t, all, 6, "the other tenant's and the duplicate are not listed")
	j1 := all[0]
	assert.Equal(t, "j1", j1.JobID)
	assert.Equal(t, "deadline passed", j1.Reason)
	assert.Equal(t, 4, j1.Attempts)
	assert.Equal(t, `{"id":"j1","v":2}`, string(j1.Body))
	assert.True(t, first.Equal(j1.FirstFailedAt), "first failure kept: %v vs %v", first, j1.FirstFailedAt)
	assert.True(t, j1.LastFailedAt.After(first))

	_, err = s.TakeDeadLetter(ctx, "globex", id)
	assert.ErrorIs(t, err, store.ErrNotFound, "another tenant cannot take it")
	taken, err := s.TakeDeadLetter(ctx, "acme", id)
	require.NoError(t, err)
	assert.Equal(t, j1, taken)
	_, err = s.TakeDeadLetter(ctx, "acme", id)
	assert.ErrorIs(t, err, store.ErrNotFound, "taken once")

	_, _, err = s.ListDeadLetters(ctx, "acme", "x", 0)
	assert.ErrorIs(t, err, store.ErrBadCursor)
}
