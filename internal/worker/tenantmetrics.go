package worker

import (
	"slices"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/ratecontrol"
)

// otherTenant labels every tenant the configuration does not name, so a
// publisher that invents tenants cannot grow the series without bound.
const otherTenant = "other"

// tenantMetrics count each tenant's provider calls and tokens. The tenant
// label is a configured tenant or "other"; GET /v1/usage has the exact
// per-tenant figures.
type tenantMetrics struct {
	known  map[string]bool
	calls  *prometheus.CounterVec
	tokens *prometheus.CounterVec
}

// MetricTenants are the tenants that get a label of their own in the
// per-tenant metrics: those under tenants:, those api_keys name, and the
// default tenant.
func MetricTenants(c config.Config) []string {
	out := []string{job.DefaultTenant}
	for name := range c.Tenants {
		out = append(out, name)
	}
	for _, name := range c.APIKeys {
		out = append(out, name)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func newTenantMetrics(tenants []string) *tenantMetrics {
	m := &tenantMetrics{
		known: map[string]bool{},
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "llmq_tenant_calls_total",
			Help: "Provider calls by tenant (a configured one, else \"other\"), model and outcome (ok, rate_limited, failed)."},
			[]string{"tenant", "model", "outcome"}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "llmq_tenant_tokens_total",
			Help: "Tokens the provider reported, by tenant (a configured one, else \"other\"), model and direction (input, output)."},
			[]string{"tenant", "model", "direction"}),
	}
	for _, t := range tenants {
		m.known[t] = true
	}
	return m
}

func (m *tenantMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.calls, m.tokens}
}

// label is tenant's label value.
func (m *tenantMetrics) label(tenant string) string {
	if m.known[tenant] {
		return tenant
	}
	return otherTenant
}

// Outcomes of a call in llmq_tenant_calls_total.
const (
	tenantCallOK          = "ok"
	tenantCallRateLimited = "rate_limited"
	tenantCallFailed      = "failed"
)

// call counts one provider answer of tenant's job on model.
func (m *tenantMetrics) call(tenant, model, outcome string, input, output int) {
	tenant = m.label(tenant)
	m.calls.WithLabelValues(tenant, model, outcome).Inc()
	if input > 0 {
		m.tokens.WithLabelValues(tenant, model, "input").Add(float64(input))
	}
	if output > 0 {
		m.tokens.WithLabelValues(tenant, model, "output").Add(float64(output))
	}
}

// tenantOutcome is the outcome label of a call that did not succeed.
func tenantOutcome(cl ratecontrol.Classification) string {
	if cl.Kind.RateLimited() {
		return tenantCallRateLimited
	}
	return tenantCallFailed
}
