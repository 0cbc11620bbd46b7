package results_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/broker/memory"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/results"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/testsvc"
)

func finished(t *testing.T, s *store.Store, j job.Job, cancel bool) {
	t.Helper()
	ctx := context.Background()
	_, created, err := s.Insert(ctx, j)
	require.NoError(t, err)
	require.True(t, created)
	if cancel {
		_, err := s.Cancel(ctx, j.Key())
		require.NoError(t, err)
		return
	}
	c, err := s.Claim(ctx, j.Key(), "w1", time.Minute)
	require.NoError(t, err)
	_, err = s.Complete(ctx, store.Attempt{Key: j.Key(), Owner: "w1", N: c.Record.Attempts},
		store.Result{ModelUsed: "qwen-plus", Response: json.RawMessage(`{"choices":[{"message":{"content":"ok"}}]}`), PromptTokens: 3, CompletionTokens: 2})
	require.NoError(t, err)
}

func sample(id string) job.Job {
	return job.Job{ID: id, Tenant: "acme", Model: "qwen-plus", Request: json.RawMessage(`{"messages":[{"role":"user","content":"hi"}]}`),
		Metadata: json.RawMessage(`{"ticket":7}`)}
}

// The relay publishes one event per finished job, with the job document,
// to the results exchange and the job's reply queue, and stores a webhook
// delivery per endpoint; a failed publish loses nothing and the repeat
// carries the same event id.
func TestRelayPublishesEveryFinishedJob(t *testing.T) {
	ctx := context.Background()
	s := store.New(testsvc.Postgres(t))
	b := memory.New(memory.Config{})
	defer b.Close()
	b.DeclareReplyQueue("llmq.reply.acme.q")

	done := sample("done")
	done.ReplyTo, done.CorrelationID, done.CallbackURL = "llmq.reply.acme.q", "corr-1", "https://hooks.acme.example/done"
	finished(t, s, done, false)
	finished(t, s, sample("gone"), true)

	delivered := 0
	relay := results.NewRelay(results.RelayParams{Store: s, Publisher: b.Publisher(),
		WebhookURLs: func(tenant string) string { return map[string]string{"acme": "https://ops.acme.example/all"}[tenant] },
		Delivered:   func() { delivered++ }})

	b.FailResults(errors.New("broker down"))
	_, err := relay.Round(ctx)
	require.Error(t, err)
	first := b.Results()
	assert.Empty(t, first)
	b.FailResults(nil)

	n, err := relay.Round(ctx)
	require.NoError(t, err)
	assert.Equal(t, 2, n)
	assert.Equal(t, 1, delivered)
	msgs := b.Results()
	require.Len(t, msgs, 2)
	byJob := map[string]results.Event{}
	for _, m := range msgs {
		var ev results.Event
		require.NoError(t, json.Unmarshal(m.Body, &ev))
		assert.Equal(t, m.EventID, ev.EventID)
		assert.Equal(t, results.RoutingKey("acme", ev.Data.Status), m.RoutingKey)
		byJob[ev.Data.ID] = ev
	}
	ev := byJob["done"]
	assert.Equal(t, "job.succeeded", ev.Type)
	assert.Equal(t, results.EventVersion, ev.Version)
	assert.Equal(t, "acme", ev.Data.Tenant)
	assert.JSONEq(t, `{"ticket":7}`, string(ev.Data.Metadata))
	assert.Equal(t, "corr-1", ev.Data.CorrelationID)
	require.NotNil(t, ev.Data.Usage)
	assert.Equal(t, 5, ev.Data.Usage.TotalTokens)
	assert.Equal(t, "job.cancelled", byJob["gone"].Type)

	n, err = relay.Round(ctx)
	require.NoError(t, err)
	assert.Zero(t, n, "the outbox is empty once relayed")
}
