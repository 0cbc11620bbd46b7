package worker

import (
	"context"
	"fmt"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/broker/memory"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/sim"
	"github.com/llmq/llmq/internal/store"
)

// Jobs of two tenants run through the worker against llmsim with
// successes, 5xx retries, jobs dead after 5xx, 429s with a fallback, and
// permanent failures: the usage rollup equals what the stored job rows
// say, the calls equal the requests llmsim received, cost is the tokens at
// the price table, and the per-tenant counters agree with both.
func TestUsageEqualsStoredJobs(t *testing.T) {
	t.Parallel()
	models := map[string]config.Model{
		"primary": {Strategy: "retry", Fallback: []string{"plain"}, Price: config.Price{InputPerMillion: 0.8, OutputPerMillion: 2}},
		"plain":   {Strategy: "retry", Price: config.Price{InputPerMillion: 0.3, OutputPerMillion: 0.6}},
		"flaky":   {Strategy: "retry", Price: config.Price{InputPerMillion: 1, OutputPerMillion: 4}},
		"ghost":   {Strategy: "retry"}, // configured here, unknown to llmsim: 404, a permanent failure
	}
	h := newHarness(t, sim.Config{
		Models: map[string]sim.ModelConfig{"primary": {RPM: 1}, "plain": {}, "flaky": {}},
		Faults: sim.FaultConfig{Seed: 11, ErrorRate: 0.3},
	}, models)
	mem := memory.New(memory.Config{})
	t.Cleanup(func() { mem.Close() })
	pub := mem.Publisher()
	cfg := h.cfg
	cfg.MetricTenants = []string{"acme"} // globex counts as "other"
	h.start(mem.Subscriber(), cfg)

	n := 0
	submit := func(tenant, model string, extra map[string]any) {
		n++
		id := fmt.Sprintf("%s-%s-%d", tenant, model, n)
		body := map[string]any{"tenant": tenant}
		for k, v := range extra {
			body[k] = v
		}
		h.submit(pub, laneOf(n), id, jobBody(id, model, n, body))
	}
	// 120 flaky jobs, a third with one attempt: at a 30% error rate the
	// chance that none dies is about 0.7^40. Which request draws which
	// fault of the seeded sequence depends on timing, so with a few dozen
	// jobs every fault may land on other requests.
	for i := range 120 {
		tenant := []string{"acme", "globex"}[i%2]
		submit(tenant, "flaky", map[string]any{"max_attempts": 1 + i%3}) // some retried, some dead
		if i < 6 {
			submit(tenant, "primary", nil) // one success on primary, then 429s and the fallback to plain
			submit(tenant, "ghost", nil)
		}
	}
	outcomes := h.wait(n, 2*time.Minute)
	require.Positive(t, outcomes["succeeded"], "outcomes: %v", outcomes)
	require.Positive(t, outcomes["failed"], "outcomes: %v", outcomes)
	require.Positive(t, outcomes["dead"], "outcomes: %v", outcomes)

	ctx := context.Background()
	f := store.UsageFilter{From: time.Now().Add(-48 * time.Hour), To: time.Now().Add(48 * time.Hour), ByTenant: true}
	usage, err := h.store.Usage(ctx, f)
	require.NoError(t, err)

	// What the job rows say, summed here from the records.
	type key struct{ tenant, model string }
	want := map[key]store.UsageRow{}
	var wantCost float64
	add := func(k key, r store.UsageRow) {
		w := want[k]
		w.Tenant, w.Model = k.tenant, k.model
		w.Calls += r.Calls
		w.InputTokens += r.InputTokens
		w.OutputTokens += r.OutputTokens
		w.RateLimited += r.RateLimited
		w.Failed += r.Failed
		want[k] = w
	}
	rows, err := h.pool.Query(ctx, `SELECT tenant, id FROM jobs`)
	require.NoError(t, err)
	var keys []job.Key
	for rows.Next() {
		var k job.Key
		require.NoError(t, rows.Scan(&k.Tenant, &k.ID))
		keys = append(keys, k)
	}
	require.NoError(t, rows.Err())
	require.Len(t, keys, n)
	fallbacks := 0
	for _, k := range keys {
		rec, err := h.store.Get(ctx, k)
		require.NoError(t, err)
		if rec.Status == job.StatusSucceeded {
			add(key{k.Tenant, rec.ModelUsed}, store.UsageRow{Calls: 1, InputTokens: int64(rec.PromptTokens), OutputTokens: int64(rec.CompletionTokens)})
			wantCost += models[rec.ModelUsed].Price.Cost(int64(rec.PromptTokens), int64(rec.CompletionTokens))
			if rec.ModelUsed != rec.Model {
				fallbacks++
			}
		}
		for _, e := range rec.Errors {
			switch e.Call {
			case store.CallRateLimited:
				add(key{k.Tenant, e.Model}, store.UsageRow{Calls: 1, RateLimited: 1})
			case store.CallFailed:
				add(key{k.Tenant, e.Model}, store.UsageRow{Calls: 1, Failed: 1})
			default:
				t.Fatalf("job %s: error entry without a call: %+v", k.ID, e)
			}
		}
	}
	require.Positive(t, fallbacks, "a job fell back to plain")
	got := map[key]store.UsageRow{}
	var gotCost float64
	for _, r := range usage {
		got[key{r.Tenant, r.Model}] = r
		gotCost += models[r.Model].Price.Cost(r.InputTokens, r.OutputTokens)
	}
	require.Equal(t, want, got)
	require.InDelta(t, wantCost, gotCost, 1e-12)
	require.Positive(t, gotCost)
	recomputed, err := h.store.UsageOfJobs(ctx, f)
	require.NoError(t, err)
	require.Equal(t, recomputed, usage)

	// Every request llmsim received is a call, and its 429s are ours.
	perModel := map[string]store.UsageRow{}
	for _, r := range usage {
		p := perModel[r.Model]
		p.Model = r.Model
		p.Calls += r.Calls
		p.InputTokens += r.InputTokens
		p.OutputTokens += r.OutputTokens
		p.RateLimited += r.RateLimited
		p.Failed += r.Failed
		perModel[r.Model] = p
	}
	t.Logf("outcomes %v, %d fallbacks, usage per model %+v", outcomes, fallbacks, perModel)
	require.Positive(t, perModel["primary"].RateLimited)
	require.Positive(t, got[key{"acme", "ghost"}].Failed, "404s of a model llmsim does not serve")
	for m, st := range h.sim.Stats().Models {
		assert.Equal(t, st.Requests, perModel[m].Calls, "calls on %s", m)
		assert.Equal(t, st.RateLimitedTotal, perModel[m].RateLimited, "429s on %s", m)
	}

	// The per-tenant counters: acme by name, globex as "other".
	counted := map[string]float64{}
	mfs, err := h.reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != "llmq_tenant_calls_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			counted[labelOf(m, "tenant")] += m.GetCounter().GetValue()
		}
	}
	perTenant := map[string]float64{}
	for _, r := range usage {
		label := r.Tenant
		if label != "acme" {
			label = otherTenant
		}
		perTenant[label] += float64(r.Calls)
	}
	require.Equal(t, perTenant, counted)
}

func labelOf(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

func TestMetricTenants(t *testing.T) {
	t.Parallel()
	c := config.Config{
		Tenants: map[string]config.Tenant{"acme": {}, "initech": {}},
		APIKeys: config.APIKeys{"k1": "acme", "k2": "globex"},
	}
	require.Equal(t, []string{"acme", job.DefaultTenant, "globex", "initech"}, MetricTenants(c))
	m := newTenantMetrics(MetricTenants(c))
	require.Equal(t, "globex", m.label("globex"))
	require.Equal(t, otherTenant, m.label("made-up"))
}
