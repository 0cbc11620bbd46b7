package api_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/api"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/results"
)

func withDestinations(cfg config.Config) harnessOpt {
	return func(c *api.Config) { c.Destinations = results.NewPolicy(cfg) }
}

var acmeResults = config.Config{Tenants: map[string]config.Tenant{"acme": {
	WebhookSecret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
	// The addresses are listed so that the address rule, not the
	// allow-list, is what refuses them.
	WebhookHosts: []string{"hooks.acme.example", "127.0.0.1", "169.254.169.254", "10.0.0.1"},
	ResultTopics: []string{"acme.results"},
}}}

// TestSubmitRefusesCallbackDestinations: callback URLs on loopback, the
// metadata service, a private address or a host outside the tenant's
// allow-list are a 400 naming callback_url, and nothing is stored.
func TestSubmitRefusesCallbackDestinations(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withDestinations(acmeResults))
	for i, tc := range []struct{ field, value, says string }{
		{"callback_url", "https://127.0.0.1/hook", "not a public address"},
		{"callback_url", "https://169.254.169.254/latest/meta-data/", "not a public address"},
		{"callback_url", "https://10.0.0.1/hook", "not a public address"},
		{"callback_url", "https://evil.example/hook", "not one of the tenant's webhook hosts"},
		{"result_topic", "globex.results", "not one of the tenant's result topics"},
	} {
		id := fmt.Sprintf("d%d", i)
		r := h.do(http.MethodPost, "/v1/jobs", keyAcme, jobBody(id, map[string]any{tc.field: tc.value}))
		require.Equal(t, http.StatusBadRequest, r.Code, "%s: %s", tc.value, r.Body)
		e := r.apiError(t)
		assert.Equal(t, api.CodeInvalidJob, e.Error.Code)
		assert.Equal(t, tc.field, e.Error.Field, tc.value)
		assert.Contains(t, e.Error.Message, tc.says, tc.value)
		assert.Equal(t, http.StatusNotFound, h.do(http.MethodGet, "/v1/jobs/"+id, keyAcme, nil).Code, "nothing stored")
	}
	// Another tenant may name none of acme's hosts; acme may name its own.
	r := h.do(http.MethodPost, "/v1/jobs", keyGlobex, jobBody("g1", map[string]any{"callback_url": "https://hooks.acme.example/h"}))
	require.Equal(t, http.StatusBadRequest, r.Code)
	assert.Equal(t, "callback_url", r.apiError(t).Error.Field)
	r = h.do(http.MethodPost, "/v1/jobs", keyAcme, jobBody("ok", map[string]any{
		"callback_url": "https://hooks.acme.example/h?token=1", "result_topic": "acme.results"}))
	require.Equal(t, http.StatusAccepted, r.Code, "%s", r.Body)

	// The batch refuses the item, naming the field.
	batch := fmt.Sprintf(`[%s, %s]`, jobBody("b1", map[string]any{"callback_url": "https://169.254.169.254/"}), jobBody("b2", nil))
	r = h.do(http.MethodPost, "/v1/jobs:batch", keyAcme, []byte(batch))
	var resp api.BatchResponse
	r.json(t, &resp)
	require.Len(t, resp.Results, 2)
	assert.Equal(t, http.StatusBadRequest, resp.Results[0].HTTPStatus)
	assert.Equal(t, "callback_url", resp.Results[0].Error.Field)
	assert.Equal(t, http.StatusAccepted, resp.Results[1].HTTPStatus)
}

// TestSubmitWithoutPolicyRefusesDestinations: a server built with no
// policy knows no tenant's hosts or topics, so it accepts none.
func TestSubmitWithoutPolicyRefusesDestinations(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	r := h.do(http.MethodPost, "/v1/jobs", keyAcme, jobBody("n1", map[string]any{"callback_url": "https://hooks.acme.example/h"}))
	require.Equal(t, http.StatusBadRequest, r.Code)
	assert.Equal(t, "callback_url", r.apiError(t).Error.Field)
}

// TestGetShowsWebhookState: the job document carries its latest
// delivery's state.
func TestGetShowsWebhookState(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withDestinations(acmeResults))
	require.Equal(t, http.StatusAccepted, h.do(http.MethodPost, "/v1/jobs", keyAcme,
		jobBody("w1", map[string]any{"callback_url": "https://hooks.acme.example/h"})).Code)
	var view api.JobView
	r := h.do(http.MethodGet, "/v1/jobs/w1", keyAcme, nil)
	r.json(t, &view)
	assert.Nil(t, view.Webhook, "no delivery yet")

	next := time.Now().Add(time.Minute).UTC().Truncate(time.Second)
	_, err := h.pool.Exec(context.Background(), `
		INSERT INTO webhook_deliveries (event_id, tenant, job_id, url, payload, attempts, last_error, last_status, next_attempt_at)
		VALUES (gen_random_uuid(), 'acme', 'w1', 'https://hooks.acme.example/h', '{}', 2, 'HTTP 503', 503, $1)`, next)
	require.NoError(t, err)
	r = h.do(http.MethodGet, "/v1/jobs/w1", keyAcme, nil)
	r.json(t, &view)
	require.NotNil(t, view.Webhook, "%s", r.Body)
	assert.Equal(t, "pending", view.Webhook.Status)
	assert.Equal(t, 2, view.Webhook.Attempts)
	assert.Equal(t, "HTTP 503", view.Webhook.LastError)
	require.NotNil(t, view.Webhook.NextAt)
	assert.True(t, next.Equal(*view.Webhook.NextAt))
}
