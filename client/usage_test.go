package client_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/client"
)

// Usage counts the calls of jobs that ran, priced at the deployment's
// price for qwen-plus (llmqConfig); other tests of the package share the
// tenant, so the jobs here are a lower bound.
func TestUsage(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	c := newClient(t, apiURL)
	var in, out int64
	for i := range 3 {
		s, err := c.Submit(ctx, client.Job{ID: randomName(fmt.Sprintf("usage-%d-", i)), Model: "qwen-plus", Request: chatRequest("count me")})
		require.NoError(t, err)
		st, err := c.Wait(ctx, s.ID, client.WaitOptions{})
		require.NoError(t, err)
		require.Equal(t, client.StatusSucceeded, st.Status)
		in, out = in+int64(st.Usage.PromptTokens), out+int64(st.Usage.CompletionTokens)
	}
	r, err := c.Usage(ctx, client.UsageQuery{From: time.Now().Add(-time.Hour), To: time.Now().Add(time.Hour), GroupBy: []string{"tenant", "model"}})
	require.NoError(t, err)
	require.Len(t, r.Rows, 1)
	row := r.Rows[0]
	assert.Equal(t, "support", row.Tenant)
	assert.Equal(t, "qwen-plus", row.Model)
	assert.GreaterOrEqual(t, row.Calls, int64(3))
	assert.GreaterOrEqual(t, row.InputTokens, in)
	assert.GreaterOrEqual(t, row.OutputTokens, out)
	assert.InDelta(t, (float64(row.InputTokens)*0.8+float64(row.OutputTokens)*2)/1e6, row.Cost, 1e-9)
	assert.Equal(t, row.UsageCounts, r.Totals)
	assert.Empty(t, r.UnpricedModels)

	_, err = c.Usage(ctx, client.UsageQuery{GroupBy: []string{"week"}})
	var apiErr *client.APIError
	require.ErrorAs(t, err, &apiErr)
	assert.Equal(t, client.CodeInvalidRequest, apiErr.Code)
	assert.Equal(t, "group_by", apiErr.Field)
}
