package api_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/api"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
)

var usagePrices = map[string]config.Model{
	"qwen-plus":  {Price: config.Price{InputPerMillion: 0.8, OutputPerMillion: 2}},
	"qwen-flash": {Price: config.Price{InputPerMillion: 0.15, OutputPerMillion: 1.5}},
	"qwen-max":   {}, // no price
}

func withUsageConfig(c *api.Config) {
	c.Models = usagePrices
	c.AdminKeys = []config.Secret{keyAdmin}
}

// seedUsage records provider answers on jobs through the store, as the
// worker does: successes with tokens, a 429 and a failed call.
func seedUsage(t *testing.T, s *store.Store) {
	t.Helper()
	ctx := context.Background()
	n := 0
	claim := func(tenant string) store.Attempt {
		n++
		j := job.Job{ID: "u" + string(rune('a'+n)), Tenant: tenant, Model: "qwen-plus", Priority: job.PriorityNormal,
			Request: json.RawMessage(`{"messages": [{"role": "user", "content": "hi"}]}`), MaxAttempts: 3}
		_, _, err := s.Insert(ctx, j)
		require.NoError(t, err)
		c, err := s.Claim(ctx, j.Key(), "w", time.Minute)
		require.NoError(t, err)
		return c.AttemptOf("w")
	}
	done := func(model string, in, out int) store.Completion {
		return store.Completion{Result: store.Result{ModelUsed: model, Response: json.RawMessage(`{}`), PromptTokens: in, CompletionTokens: out}}
	}
	items := []store.Completion{done("qwen-plus", 100, 50), done("qwen-plus", 300, 70), done("qwen-flash", 1000, 10), done("qwen-plus", 7, 3)}
	for i, tenant := range []string{"acme", "acme", "acme", "globex"} {
		items[i].Attempt = claim(tenant)
	}
	oks, err := s.CompleteBatch(ctx, items)
	require.NoError(t, err)
	require.Equal(t, []bool{true, true, true, true}, oks)
	ok, err := s.DeferRateLimited(ctx, claim("acme"), time.Now(),
		store.AttemptError{Model: "qwen-plus", Kind: "rate_limit_requests", Message: "429", Call: store.CallRateLimited})
	require.NoError(t, err)
	require.True(t, ok)
	ok, err = s.Fail(ctx, claim("globex"), store.AttemptError{Model: "qwen-max", Kind: "server", Message: "500", Call: store.CallFailed})
	require.NoError(t, err)
	require.True(t, ok)
}

func (h *harness) usage(key string, q url.Values) (api.UsageResponse, response) {
	h.t.Helper()
	r := h.do(http.MethodGet, "/v1/usage?"+q.Encode(), key, nil)
	var u api.UsageResponse
	if r.Code == http.StatusOK {
		r.json(h.t, &u)
	}
	return u, r
}

func TestUsageEndpoint(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withUsageConfig)
	seedUsage(t, h.store)
	cost := func(model string, in, out int64) float64 { return usagePrices[model].Price.Cost(in, out) }

	// A tenant sees its own usage, per model, priced.
	u, r := h.usage(keyAcme, url.Values{"group_by": {"model"}})
	require.Equal(t, http.StatusOK, r.Code, "%s", r.Body)
	require.Len(t, u.Rows, 2)
	byModel := map[string]api.UsageGroup{}
	for _, row := range u.Rows {
		assert.Empty(t, row.Tenant)
		assert.Nil(t, row.Start)
		byModel[row.Model] = row
	}
	plus := byModel["qwen-plus"]
	assert.Equal(t, api.UsageGroup{Model: "qwen-plus", UsageCounts: api.UsageCounts{Calls: 3, InputTokens: 400, OutputTokens: 120, RateLimited: 1,
		Cost: cost("qwen-plus", 400, 120)}}, plus)
	assert.InDelta(t, 400*0.8/1e6+120*2/1e6, plus.Cost, 1e-12)
	flash := byModel["qwen-flash"]
	assert.EqualValues(t, 1, flash.Calls)
	assert.InDelta(t, cost("qwen-flash", 1000, 10), flash.Cost, 1e-12)
	assert.Equal(t, api.UsageCounts{Calls: 4, InputTokens: 1400, OutputTokens: 130, RateLimited: 1,
		Cost: plus.Cost + flash.Cost}, u.Totals)
	assert.Empty(t, u.UnpricedModels)
	assert.Equal(t, []string{"model"}, u.GroupBy)

	// Without group_by, one row that equals the totals.
	all, r := h.usage(keyAcme, nil)
	require.Equal(t, http.StatusOK, r.Code)
	require.Len(t, all.Rows, 1)
	assert.Equal(t, u.Totals.Calls, all.Rows[0].Calls)
	assert.InDelta(t, u.Totals.Cost, all.Rows[0].Cost, 1e-12)

	// Its own tenant by name is fine; another's is refused.
	own, r := h.usage(keyAcme, url.Values{"tenant": {"acme"}})
	require.Equal(t, http.StatusOK, r.Code)
	assert.Equal(t, all.Totals, own.Totals)
	_, r = h.usage(keyAcme, url.Values{"tenant": {"globex"}})
	require.Equal(t, http.StatusForbidden, r.Code)
	assert.Equal(t, api.CodeForbidden, r.apiError(t).Error.Code)
	other, r := h.usage(keyGlobex, url.Values{"group_by": {"tenant"}})
	require.Equal(t, http.StatusOK, r.Code)
	require.Len(t, other.Rows, 1)
	assert.Equal(t, "globex", other.Rows[0].Tenant)
	assert.Equal(t, []string{"qwen-max"}, other.UnpricedModels)
	assert.EqualValues(t, 1, other.Totals.Failed)

	// An admin sees every tenant, and may pick one.
	adm, r := h.usage(keyAdmin, url.Values{"group_by": {"tenant,model,hour"}})
	require.Equal(t, http.StatusOK, r.Code, "%s", r.Body)
	assert.Len(t, adm.Rows, 4)
	assert.EqualValues(t, 6, adm.Totals.Calls)
	hour := time.Now().UTC().Truncate(time.Hour)
	for _, row := range adm.Rows {
		require.NotNil(t, row.Start)
		assert.Equal(t, hour, *row.Start, "%+v", row)
	}
	picked, r := h.usage(keyAdmin, url.Values{"tenant": {"globex"}, "group_by": {"tenant,day"}})
	require.Equal(t, http.StatusOK, r.Code)
	require.Len(t, picked.Rows, 1)
	assert.Equal(t, time.Now().UTC().Truncate(24*time.Hour), *picked.Rows[0].Start)
	assert.Equal(t, other.Totals, picked.Totals)

	// A range that ends before the calls counts nothing.
	past, r := h.usage(keyAdmin, url.Values{"from": {"2026-01-01T00:00:00Z"}, "to": {"2026-01-02T00:00:00Z"}})
	require.Equal(t, http.StatusOK, r.Code)
	assert.Empty(t, past.Rows)
	assert.Zero(t, past.Totals)
}

func TestUsageBadQuery(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withUsageConfig)
	for _, c := range []struct {
		field string
		q     url.Values
	}{
		{"from", url.Values{"from": {"yesterday"}}},
		{"to", url.Values{"to": {"2026-13-01T00:00:00Z"}}},
		{"from", url.Values{"from": {"2026-02-01T00:00:00Z"}, "to": {"2026-01-01T00:00:00Z"}}},
		{"group_by", url.Values{"group_by": {"tenant,week"}}},
		{"group_by", url.Values{"group_by": {"day,hour"}}},
	} {
		_, r := h.usage(keyAcme, c.q)
		require.Equal(t, http.StatusBadRequest, r.Code, "%v: %s", c.q, r.Body)
		e := r.apiError(t)
		assert.Equal(t, api.CodeInvalidRequest, e.Error.Code)
		assert.Equal(t, c.field, e.Error.Field, "%v", c.q)
	}
	_, r := h.usage("", nil)
	assert.Equal(t, http.StatusUnauthorized, r.Code)
}

func TestUsageStoreDown(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	srv, err := api.New(api.Config{Store: closedPoolStore(t), Publisher: h.pub, Inspector: h.insp, APIKeys: testKeys})
	require.NoError(t, err)
	down := *h
	down.http = newTestServer(t, srv)
	r := down.do(http.MethodGet, "/v1/usage", keyAcme, nil)
	require.Equal(t, http.StatusServiceUnavailable, r.Code, "%s", r.Body)
	assert.Equal(t, api.CodeStoreUnavailable, r.apiError(t).Error.Code)
}
