package webhook_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/results"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/webhook"
)

// TestFinishedJobIsDelivered runs the path from a job to its receiver: the
// job finishes (the trigger writes its outbox row), a delivery is written
// as the relay writes it (the event's JSON as payload), the dispatcher
// sends it, and the receiver verifies the signature and reads the event.
func TestFinishedJobIsDelivered(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testPool(t)
	st := store.New(pool)
	j := job.Job{ID: "j-hook", Tenant: "acme", Model: "qwen-plus", Priority: job.PriorityNormal, MaxAttempts: 3,
		Request: json.RawMessage(`{"messages":[{"role":"user","content":"hi"}]}`)}
	rc := newReceiver(t, testSecret, time.Now, func(*http.Request) int { return http.StatusOK })
	j.CallbackURL = rc.srv.URL + "/hook"
	_, created, err := st.Insert(ctx, j)
	require.NoError(t, err)
	require.True(t, created)
	_, err = pool.Exec(ctx, `UPDATE jobs SET status = 'succeeded', attempts = 1, started_at = now(), completed_at = now(),
		model_used = 'qwen-plus', response = '{"choices":[]}', prompt_tokens = 3, completion_tokens = 2
		WHERE tenant = 'acme' AND id = 'j-hook'`)
	require.NoError(t, err)

	// What the relay does with the outbox row.
	var (
		eventID string
		at      time.Time
	)
	require.NoError(t, pool.QueryRow(ctx, `SELECT event_id::text, occurred_at FROM result_events
		WHERE tenant = 'acme' AND job_id = 'j-hook'`).Scan(&eventID, &at))
	rec, err := st.Get(ctx, j.Key())
	require.NoError(t, err)
	payload, err := json.Marshal(results.Event{Type: results.EventType(rec.Status), Version: results.EventVersion,
		EventID: eventID, Timestamp: at, Data: results.DocumentOf(rec)})
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO webhook_deliveries (event_id, tenant, job_id, url, payload, next_attempt_at)
		VALUES ($1, 'acme', 'j-hook', $2, $3, now())`, eventID, rec.CallbackURL, payload)
	require.NoError(t, err)

	r := startDispatcher(t, pool, webhook.Params{Webhooks: localHooks})
	r.d.Kick()
	a := r.next(t)
	assert.Equal(t, webhook.OutcomeDelivered, a.Outcome)
	assert.Equal(t, 200, a.Status)

	hits, good, bad := rc.snapshot()
	assert.Zero(t, bad)
	assert.Equal(t, 1, hits[eventID], "webhook-id is the event id")
	require.Contains(t, good, eventID)
	assert.Equal(t, string(payload), string(good[eventID]), "the stored bytes, unchanged")
	var ev results.Event
	require.NoError(t, json.Unmarshal(good[eventID], &ev))
	assert.Equal(t, "job.succeeded", ev.Type)
	assert.Equal(t, "j-hook", ev.Data.ID)
	require.NotNil(t, ev.Data.Usage)
	assert.Equal(t, 5, ev.Data.Usage.TotalTokens)

	states, err := st.WebhookStates(ctx, []job.Key{j.Key()})
	require.NoError(t, err)
	assert.Equal(t, "delivered", states[j.Key()].Status)
	assert.Equal(t, 1, states[j.Key()].Attempts)
}
