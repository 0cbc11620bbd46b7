package api

import (
	"fmt"
	"net/http"

	"github.com/llmq/llmq/internal/job"
)

// TenantStatus is one tenant's back-pressure. Backlog counts the jobs
// Postgres holds for the tenant as queued, retrying or running, plus those
// the API admitted since it last measured: a job published raw to the
// broker counts once the ingester has stored it, since the broker's
// depth is not split by tenant.
type TenantStatus struct {
	// State is against the tenant's own backlog_limit: ok, throttled (over
	// the same fraction of it as backpressure.soft_limit is of hard_limit)
	// or full (at it: the tenant's submissions get 429). Always ok for a
	// tenant without a limit, which only the global limits hold.
	State   string `json:"state"`
	Backlog int64  `json:"backlog"`
	// BacklogLimit is tenants.<name>.backlog_limit; 0 for none.
	BacklogLimit int64 `json:"backlog_limit"`
	// DrainRate is the tenant's jobs finished per second over the last
	// minute, every lane together.
	DrainRate float64 `json:"drain_rate"`
	// ETASeconds is Backlog/DrainRate; 0 for an empty backlog, null while
	// the tenant drains nothing.
	ETASeconds *float64 `json:"eta_seconds"`
}

// tenantStateFor is a tenant's state against its own limit, throttled
// from the same fraction of it as the global soft limit is of the hard.
func tenantStateFor(backlog, limit, soft, hard int64) string {
	if limit <= 0 {
		return StateOK
	}
	return stateFor(backlog, max(limit*soft/hard, 1), limit)
}

// tenantSnapshot is the per-tenant side of the monitor: what the last
// refresh measured, and what was admitted since. Its owner's mutex guards
// it.
type tenantSnapshot struct {
	lanes   map[string]map[job.Priority]int64 // Postgres backlog per lane
	drain   map[string]float64
	pending map[string]int64 // admitted and not yet in a measurement
	stored  map[string]int64 // of pending, those whose rows have committed
}

func newTenantSnapshot() tenantSnapshot {
	return tenantSnapshot{lanes: map[string]map[job.Priority]int64{}, drain: map[string]float64{},
		pending: map[string]int64{}, stored: map[string]int64{}}
}

// backlog is tenant's measured backlog plus what was admitted since.
func (t *tenantSnapshot) backlog(tenant string) int64 {
	var n int64
	for _, c := range t.lanes[tenant] {
		n += c
	}
	return n + t.pending[tenant]
}

func (t *tenantSnapshot) unpend(tenant string, n int64) {
	if t.pending[tenant] -= n; t.pending[tenant] == 0 {
		delete(t.pending, tenant)
	}
}

// measured replaces the measurements; storedAtStart is what had been
// admitted and committed before the measurement began, which it now
// includes.
func (t *tenantSnapshot) measured(lanes map[string]map[job.Priority]int64, storedAtStart map[string]int64) {
	t.lanes = lanes
	for tenant, n := range storedAtStart {
		t.unpend(tenant, n)
		if t.stored[tenant] -= n; t.stored[tenant] == 0 {
			delete(t.stored, tenant)
		}
	}
}

// drained replaces the drain rates.
func (t *tenantSnapshot) drained(drain map[string]float64) {
	if drain == nil {
		drain = map[string]float64{}
	}
	t.drain = drain
}

// states is the state of every tenant with a limit.
func (t *tenantSnapshot) states(limits map[string]int64, soft, hard int64) map[string]string {
	if len(limits) == 0 {
		return nil
	}
	out := make(map[string]string, len(limits))
	for tenant, limit := range limits {
		if limit <= 0 {
			continue
		}
		out[tenant] = tenantStateFor(t.backlog(tenant), limit, soft, hard)
	}
	return out
}

// status is tenant's document.
func (t *tenantSnapshot) status(tenant string, limit, soft, hard int64) TenantStatus {
	b := t.backlog(tenant)
	d := t.drain[tenant]
	return TenantStatus{State: tenantStateFor(b, limit, soft, hard), Backlog: b, BacklogLimit: limit, DrainRate: d, ETASeconds: eta(b, d)}
}

// lanesOf sums the tenants' backlogs per lane.
func lanesOf(perTenant map[string]map[job.Priority]int64) map[job.Priority]int64 {
	out := make(map[job.Priority]int64, len(job.Priorities))
	for _, lanes := range perTenant {
		for lane, n := range lanes {
			out[lane] += n
		}
	}
	return out
}

// tenantView is the status document of one tenant: the global state and
// limits, the tenant's own numbers (roles.go).
func (m *monitor) tenantView(tenant string) Status {
	m.mu.Lock()
	defer m.mu.Unlock()
	ts := m.tenants.status(tenant, m.limits[tenant], m.soft, m.hard)
	// The lanes are as measured, like the global document's; the tenant's
	// entry adds the jobs admitted since.
	lanes := make(map[job.Priority]int64, len(job.Priorities))
	var total int64
	for _, lane := range job.Priorities {
		lanes[lane] = m.tenants.lanes[tenant][lane]
		total += lanes[lane]
	}
	return Status{
		State: m.status.State, Backlog: lanes, Total: total, DrainRate: ts.DrainRate, ETASeconds: eta(total, ts.DrainRate),
		SoftLimit: m.status.SoftLimit, HardLimit: m.status.HardLimit, UpdatedAt: m.status.UpdatedAt,
		Tenant: tenant, Tenants: map[string]TenantStatus{tenant: ts},
	}
}

// adminView is the global document with every tenant's: those with a
// backlog, a limit, a recent finish or a job admitted since the last
// measurement.
func (m *monitor) adminView() Status {
	m.mu.Lock()
	defer m.mu.Unlock()
	st := m.status
	st.Tenants = map[string]TenantStatus{}
	for _, names := range []map[string]int64{m.limits, m.tenants.pending} {
		for tenant := range names {
			st.Tenants[tenant] = TenantStatus{}
		}
	}
	for tenant := range m.tenants.lanes {
		st.Tenants[tenant] = TenantStatus{}
	}
	for tenant := range m.tenants.drain {
		st.Tenants[tenant] = TenantStatus{}
	}
	for tenant := range st.Tenants {
		st.Tenants[tenant] = m.tenants.status(tenant, m.limits[tenant], m.soft, m.hard)
	}
	return st
}

// handleStatus answers GET /v1/status (statusFor).
func (s *Server) handleStatus(w http.ResponseWriter, r *http.Request, tenant string) {
	writeJSON(w, http.StatusOK, s.statusFor(r, tenant))
}

func tenantBackpressureError(backlog, limit int64, retryAfterSeconds float64) *errorResponse {
	e := backpressureError(backlog, retryAfterSeconds)
	e.Body.Message = fmt.Sprintf("the tenant's backlog is at its backlog_limit (%d); retry after the Retry-After delay", limit)
	return e
}
