package store_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/store"
)

// What providers answer reaches Postgres, and Postgres refuses the NUL
// character in text and jsonb: an answer, an error message or a dead
// letter's error that holds one is stored with U+FFFD in its place, not
// refused (which would fail every job written by the same statement).
func TestProviderTextWithNULIsStored(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newStore(t)

	answered := sampleJob("acme", "nul-answer")
	c := insertClaimed(t, s, answered, "w1", time.Minute)
	ok, err := s.Complete(ctx, c.AttemptOf("w1"), store.Result{ModelUsed: "qwen-plus",
		Response: json.RawMessage(`{"choices":[{"message":{"content":"a\u0000b\ud83dc"}}]}`)})
	require.NoError(t, err)
	require.True(t, ok)
	var resp struct {
		Choices []struct{ Message struct{ Content string } }
	}
	require.NoError(t, json.Unmarshal(mustGet(t, s, answered.Key()).Response, &resp))
	assert.Equal(t, "a\uFFFDb\uFFFDc", resp.Choices[0].Message.Content, "NUL and a lone surrogate replaced")

	failed := sampleJob("acme", "nul-error")
	c = insertClaimed(t, s, failed, "w1", time.Minute)
	ae := attemptErr("client")
	ae.Message, ae.Code = "bad \x00 input", "E\x00"
	ok, err = s.Fail(ctx, c.AttemptOf("w1"), ae)
	require.NoError(t, err)
	require.True(t, ok)
	rec := mustGet(t, s, failed.Key())
	require.Len(t, rec.Errors, 1)
	assert.Equal(t, "bad \uFFFD input", rec.Errors[0].Message)
	log, err := s.AttemptLog(ctx, failed.Key())
	require.NoError(t, err)
	require.Len(t, log, 1)
	assert.Equal(t, "E\uFFFD", log[0].Code)

	id, err := s.RecordDeadLetter(ctx, store.DeadLetterRow{Tenant: "acme", JobID: "nul-error", Lane: "normal",
		Reason: "provider said \x00", LastError: "\x00 and \xff", Body: []byte("{}")})
	require.NoError(t, err)
	dl, err := s.GetDeadLetter(ctx, "acme", id)
	require.NoError(t, err)
	assert.Equal(t, "provider said \uFFFD", dl.Reason)
	assert.Equal(t, "\uFFFD and \uFFFD", dl.LastError, "a byte that is not UTF-8 replaced too")
}
