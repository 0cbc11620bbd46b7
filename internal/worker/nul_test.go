package worker

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/llmq/llmq/internal/provider"
)

// A provider answer that holds the NUL character (the JSON escape \u0000,
// which Postgres's jsonb refuses) is stored with the replacement character
// in its place, and the jobs stored beside it in the same statement are
// stored too. It used to fail every completion of its batch, again at
// each retry.
func TestAnswerWithNULIsStoredAndSoAreItsNeighbours(t *testing.T) {
	t.Parallel()
	r := newWriteOnceRig(t, func(inner Provider) Provider {
		return providerFunc(func(ctx context.Context, model string, request []byte) (*provider.Response, error) {
			resp, err := inner.Chat(ctx, model, request)
			if err == nil && bytes.Contains(request, []byte("ticket nul")) {
				resp.Body = []byte(`{"object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"a\u0000b\udc00"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`)
			}
			return resp, err
		})
	})
	r.publish(t, "nul", "plain-1", "plain-2")
	assert.Equal(t, map[string]int{"succeeded": 3}, r.h.wait(3, time.Minute))
	r.stop()
	assert.Equal(t, 3, r.count(t, "status = 'succeeded'"))
	assert.Equal(t, 1, r.count(t, "id = 'nul' AND response->'choices'->0->'message'->>'content' = E'a\\uFFFDb\\uFFFD'"),
		"stored with the replacement character")
}
