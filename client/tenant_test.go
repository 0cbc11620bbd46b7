package client_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/testsvc"
)

const adminKey = "key-admin-0123456789"

// TestTenantBackpressure runs the producer with a backlog_limit for
// tenant support and an admin key: support's second job gets 429 from its
// own limit while the global state is ok, its status shows its own backlog
// only, and the admin acts for any tenant with WithTenant.
func TestTenantBackpressure(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	td := cleanup(t)
	pg, err := newDatabase(ctx, td)
	require.NoError(t, err)
	cfg, err := llmqConfig(pg, "kafka", "", testsvc.KafkaBrokers(t),
		"admin_keys: ["+adminKey+"]\ntenants: {support: {backlog_limit: 1}}\n")
	require.NoError(t, err)
	api, err := startLLMQ(ctx, td, cfg, false)
	require.NoError(t, err)
	c := newClient(t, api)

	_, err = c.Submit(ctx, client.Job{ID: "t-1", Model: "qwen-plus", Request: chatRequest("one")})
	require.NoError(t, err)
	_, err = c.Submit(ctx, client.Job{ID: "t-2", Model: "qwen-plus", Request: chatRequest("two")})
	var bp *client.BackpressureError
	require.ErrorAs(t, err, &bp)
	assert.EqualValues(t, 1, bp.Backlog)
	assert.Positive(t, bp.RetryAfter)

	// The admin submits as another tenant, which its limit does not hold.
	admin, err := client.New(api, client.WithAPIKey(adminKey), client.WithTenant("moderation"))
	require.NoError(t, err)
	sub, err := admin.Submit(ctx, client.Job{ID: "m-1", Model: "qwen-plus", Request: chatRequest("three")})
	require.NoError(t, err)
	assert.True(t, sub.Created)
	got, err := admin.Get(ctx, "m-1")
	require.NoError(t, err)
	assert.Equal(t, "moderation", got.Tenant)
	var apiErr *client.APIError
	_, err = c.Get(ctx, "m-1")
	require.ErrorAs(t, err, &apiErr)
	assert.Equal(t, client.CodeNotFound, apiErr.Code, "support never sees moderation's job")
	_, err = newClient(t, api, client.WithTenant("moderation")).DeadLetters(ctx, "")
	require.ErrorAs(t, err, &apiErr)
	assert.Equal(t, client.CodeForbidden, apiErr.Code)

	st, err := c.Backpressure(ctx)
	require.NoError(t, err)
	assert.Equal(t, "support", st.Tenant)
	assert.NotContains(t, st.Tenants, "moderation")
	assert.Nil(t, st.TenantStates)
	all, err := client.New(api, client.WithAPIKey(adminKey))
	require.NoError(t, err)
	// The status is refreshed once a second; wait for a refresh that has
	// seen support's backlog (the first may still be running under load).
	// TenantState reads the admin's per-tenant entry, which counts jobs
	// admitted since the last refresh; tenant_states is the refresh's own,
	// so wait on that.
	var everything client.BackpressureStatus
	require.Eventually(t, func() bool {
		everything, err = all.Backpressure(ctx)
		require.NoError(t, err)
		return everything.TenantStates["support"] == "full"
	}, 30*time.Second, 50*time.Millisecond, "the admin's status shows support full")
	assert.Empty(t, everything.Tenant)
	assert.Contains(t, everything.Tenants, "moderation")
	assert.Equal(t, "full", everything.TenantState("support"))
	assert.Equal(t, "ok", everything.TenantState("moderation"))
	assert.Equal(t, map[string]string{"support": "full"}, everything.TenantStates)
}
