package store

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestLogEntryEncodesAsEncodingJSON: the hand-written encoding is
// encoding/json's, byte for byte, for every field set or left empty and
// for strings that need escaping.
func TestLogEntryEncodesAsEncodingJSON(t *testing.T) {
	at := time.Date(2026, 12, 6, 3, 4, 5, 123456000, time.UTC)
	whole := time.Date(2026, 12, 6, 3, 4, 5, 0, time.UTC)
	full := AttemptLogEntry{Attempt: 3, Model: "qwen-plus", Outcome: OutcomeRateLimited, Kind: "rate_limit_tokens",
		HTTPStatus: 429, Code: "Throttling.RateQuota", Message: "Requests rate limit exceeded", ClaimedAt: &at,
		StartedAt: &whole, EndedAt: at, PromptTokens: 12, CompletionTokens: 345}
	for _, e := range []AttemptLogEntry{
		{},
		full,
		{Attempt: 1, Outcome: OutcomeSucceeded, EndedAt: whole, PromptTokens: 7},
		{Attempt: 2, Outcome: "server", Message: "bad \"gateway\"\n\t<html> & \\ é 中文 \x01", EndedAt: at},
		{Attempt: 2, Outcome: "client", Message: "invalid \xff\xfe utf-8", Code: "\u2028", EndedAt: at},
		{Attempt: -1, Outcome: "x", HTTPStatus: -5, EndedAt: at.In(time.FixedZone("X", 3600))},
	} {
		want, err := json.Marshal([]any{e})
		require.NoError(t, err)
		require.Equal(t, string(want), logEntry(e))
	}
}

// BenchmarkLogEntry is a success's entry, as every completion writes.
func BenchmarkLogEntry(b *testing.B) {
	at := time.Date(2026, 12, 6, 3, 4, 5, 123456000, time.UTC)
	e := AttemptLogEntry{Attempt: 1, Model: "qwen-plus", Outcome: OutcomeSucceeded, HTTPStatus: 200, ClaimedAt: &at,
		StartedAt: &at, EndedAt: at, PromptTokens: 263, CompletionTokens: 21}
	b.Run("hand", func(b *testing.B) {
		for b.Loop() {
			_ = logEntry(e)
		}
	})
	b.Run("encoding_json", func(b *testing.B) {
		for b.Loop() {
			_, _ = oneElementArray(e, "entry")
		}
	})
}
