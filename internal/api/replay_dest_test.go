package api_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/api"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/results"
	"github.com/llmq/llmq/internal/store"
)

// A job refused at intake and replayed once its model is configured runs
// with the destinations and trace context its body named (the refusal's
// row could hold none of them): its webhook and its result topic hear of
// it. Destinations the tenant may not use refuse the replay, as they
// refuse a submission.
func TestReplayOfAJobRefusedAtIntakeKeepsItsDestinations(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withModels("qwen-plus"))
	ctx := context.Background()
	refuse := func(id string, extra map[string]any) int64 {
		extra["model"], extra["tenant"] = "qwen-max", "acme"
		_, err := h.store.RecordIntakeFailure(ctx, store.IntakeFailure{Tenant: "acme", ID: id, Model: "qwen-max",
			Lane: job.PriorityNormal, Reason: "model not configured", Body: jobBody(id, extra)})
		require.NoError(t, err)
		var dlq api.DLQResponse
		h.do("GET", "/v1/dlq", keyAcme, nil).json(t, &dlq)
		for _, dl := range dlq.DeadLetters {
			if dl.JobID == id {
				return dl.ID
			}
		}
		t.Fatalf("no dead letter of %s", id)
		return 0
	}
	good := refuse("late-model", map[string]any{"callback_url": "https://hooks.acme.example/x", "result_topic": "acme.results",
		"reply_to": "llmq.reply.acme.q", "correlation_id": "c-7"})
	bad := refuse("late-evil", map[string]any{"callback_url": "https://evil.example/x"})

	later := newHarnessWithStore(t, h)
	srv, err := api.New(api.Config{Store: h.store, Publisher: later.pub, Inspector: h.insp, APIKeys: testKeys,
		Models: map[string]config.Model{"qwen-plus": {}, "qwen-max": {}}, Destinations: results.NewPolicy(acmeResults)})
	require.NoError(t, err)
	later.http = newTestServer(t, srv)

	r := later.do("POST", fmt.Sprintf("/v1/dlq/%d/replay", good), keyAcme, nil)
	require.Equal(t, http.StatusAccepted, r.Code, "%s", r.Body)
	rec, err := h.store.Get(ctx, job.Key{Tenant: "acme", ID: "late-model"})
	require.NoError(t, err)
	assert.Equal(t, "https://hooks.acme.example/x", rec.CallbackURL)
	assert.Equal(t, "acme.results", rec.ResultTopic)
	assert.Equal(t, "llmq.reply.acme.q", rec.ReplyTo)
	assert.Equal(t, "c-7", rec.CorrelationID)

	r = later.do("POST", fmt.Sprintf("/v1/dlq/%d/replay", bad), keyAcme, nil)
	require.Equal(t, http.StatusConflict, r.Code, "%s", r.Body)
	assert.Contains(t, r.apiError(t).Error.Message, "callback_url")
}
