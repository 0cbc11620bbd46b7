package api

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"sync"
	"time"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/job"
)

// Back-pressure states.
const (
	StateOK        = "ok"
	StateThrottled = "throttled"
	StateFull      = "full"
)

// drainWindow is how far back the drain rate looks.
const drainWindow = time.Minute

// noDrainRetryAfter is the Retry-After when nothing has drained lately: the
// guide's "the service typically resumes within one minute"
// (docs/design.md#provider-limits), halved.
const noDrainRetryAfter = 30 * time.Second

// drainEvery is how often the background refresh re-measures the drain
// rate (a count over the last minute of completions), less often than the
// backlog.
const drainEvery = 5 * time.Second

// maxRetryAfter caps Retry-After.
const maxRetryAfter = 10 * time.Minute

// Status is the back-pressure document of GET /v1/status and llmq.status.
// The global members (State through UpdatedAt) are the whole system's,
// except on a tenant key's GET /v1/status, where Backlog, Total,
// DrainRate and ETASeconds are the tenant's own (Tenant names it) and
// State, SoftLimit and HardLimit stay global: no tenant sees another's
// numbers (roles.go).
type Status struct {
	State string `json:"state"`
	// Backlog per lane: the larger of the broker's depth and the jobs
	// Postgres holds as queued, retrying or running.
	Backlog map[job.Priority]int64 `json:"backlog"`
	Total   int64                  `json:"total"`
	// DrainRate is jobs finished per second over the last minute.
	DrainRate float64 `json:"drain_rate"`
	// ETASeconds is Total/DrainRate; null while nothing drains.
	ETASeconds *float64  `json:"eta_seconds"`
	SoftLimit  int64     `json:"soft_limit"`
	HardLimit  int64     `json:"hard_limit"`
	UpdatedAt  time.Time `json:"updated_at"`
	// Tenant, on a tenant's GET /v1/status, names the tenant the document
	// is about; Tenants then holds its entry only.
	Tenant string `json:"tenant,omitempty"`
	// Tenants is each tenant's back-pressure: on an admin's GET
	// /v1/status every tenant with a backlog, a backlog limit or a recent
	// finish; never on llmq.status.
	Tenants map[string]TenantStatus `json:"tenants,omitempty"`
	// TenantStates is the state of each tenant with a backlog_limit: on
	// llmq.status, where a producer publishing raw (no 429 to get) learns
	// its tenant is over its limit, and on an admin's GET /v1/status. It
	// holds states, not numbers, since every reader of llmq.status sees
	// every tenant's entry.
	TenantStates map[string]string `json:"tenant_states,omitempty"`
}

func stateFor(total, soft, hard int64) string {
	switch {
	case total >= hard:
		return StateFull
	case total > soft:
		return StateThrottled
	}
	return StateOK
}

// retryAfter is how long until the backlog has drained by excess jobs at
// drainRate, clamped to [1s, maxRetryAfter].
func retryAfter(excess int64, drainRate float64) time.Duration {
	if drainRate <= 0 {
		return noDrainRetryAfter
	}
	d := time.Duration(math.Ceil(float64(excess)/drainRate)) * time.Second
	return min(max(d, time.Second), maxRetryAfter)
}

// monitor keeps the cached status and admits submissions against it, the
// global limits and each tenant's backlog_limit (tenant_status.go). Jobs
// admitted since the last refresh count on top of the cached backlog, so a
// burst between two refreshes cannot overshoot either limit. An admitted job
// leaves that count only once a Postgres count that began after its row
// committed has measured it: a job admitted but still being inserted when a
// count runs is not in that count.
type monitor struct {
	store     Store
	inspector broker.Inspector
	pub       broker.Publisher
	soft      int64
	hard      int64
	interval  time.Duration
	now       func() time.Time
	log       *slog.Logger
	metrics   *metrics
	// finishRate, when set, is the jobs finished per second as the
	// job-finished listener hears them (every lane together): counting
	// notifications costs nothing, where store.DrainRate scans the jobs
	// table's completed_at, which no index covers.
	finishRate func() float64
	// tenantRates, when set, is each recently draining tenant's jobs
	// finished per second, from the same listener; without it a tenant's
	// drain rate reads 0 and its Retry-After is noDrainRetryAfter.
	tenantRates func() map[string]float64
	// limits is each tenant's backlog_limit (absent: none of its own).
	limits map[string]int64

	mu      sync.Mutex
	status  Status
	pending int64 // admitted and not yet in a measurement
	stored  int64 // of pending, those whose rows have committed
	drainAt time.Time
	tenants tenantSnapshot
	// countedAt and countTook time the last Postgres count of the backlog
	// (countBudget).
	countedAt time.Time
	countTook time.Duration
}

// countBudget bounds the share of time the monitor spends counting the
// backlog in Postgres: after a count that took d, the next waits until
// d*countBudget has passed since it began (at 1M unfinished jobs a count
// takes a few hundred milliseconds: docs/tenants-apiroles.md). Meanwhile
// the admitted jobs count on top of the last count, as between any two.
const countBudget = 10

func (m *monitor) snapshot() Status {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.status
}

// admission is the verdict on n new jobs of a tenant.
type admission struct {
	ok         bool
	backlog    int64
	retryAfter time.Duration
	// tenantLimit is set when the tenant's own backlog_limit refused them.
	tenantLimit int64
}

// refusal is the 429 of a refused admission.
func (a admission) refusal() *errorResponse {
	if a.tenantLimit > 0 {
		return tenantBackpressureError(a.backlog, a.tenantLimit, a.retryAfter.Seconds())
	}
	return backpressureError(a.backlog, a.retryAfter.Seconds())
}

// admit reserves room for n jobs of tenant (check); release undoes it for
// jobs that were not created after all, stored marks those whose rows have
// committed, which the next Postgres count measures.
func (m *monitor) admit(tenant string, n int64) admission {
	m.mu.Lock()
	defer m.mu.Unlock()
	a := m.check(tenant, n)
	if a.ok {
		m.pending += n
		m.tenants.pending[tenant] += n
	}
	return a
}

// verdict is what admit would answer, reserving nothing.
func (m *monitor) verdict(tenant string, n int64) admission {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.check(tenant, n)
}

// check judges n jobs of tenant: first against the tenant's own
// backlog_limit, with a Retry-After from the tenant's own drain rate, then
// against the global hard limit. The caller holds m.mu.
func (m *monitor) check(tenant string, n int64) admission {
	if limit := m.limits[tenant]; limit > 0 {
		backlog := m.tenants.backlog(tenant)
		if backlog+n > limit {
			return admission{backlog: backlog, tenantLimit: limit,
				retryAfter: retryAfter(backlog+n-limit, m.tenants.drain[tenant])}
		}
	}
	backlog := m.status.Total + m.pending
	if backlog+n > m.hard {
		return admission{backlog: backlog, retryAfter: retryAfter(backlog+n-m.hard, m.status.DrainRate)}
	}
	return admission{ok: true, backlog: backlog + n}
}

func (m *monitor) release(tenant string, n int64) {
	m.mu.Lock()
	m.pending -= n
	m.tenants.unpend(tenant, n)
	m.mu.Unlock()
}

func (m *monitor) storedJobs(tenant string, n int64) {
	m.mu.Lock()
	m.stored += n
	m.tenants.stored[tenant] += n
	m.mu.Unlock()
}

// refresh measures the backlog (per tenant and lane in Postgres when
// forced or due under countBudget, per lane on the broker) and the drain
// rates (from the listener, or, without one, the global rate from Postgres
// when forced or older than drainEvery) and replaces the cached status. It
// reports whether the global state or a tenant's state changed.
func (m *monitor) refresh(ctx context.Context, force bool) (Status, bool, error) {
	m.mu.Lock()
	storedAtStart := m.stored
	tenantStoredAtStart := maps.Clone(m.tenants.stored)
	drain, drainAt := m.status.DrainRate, m.drainAt
	perTenant := m.tenants.lanes
	count := force || m.now().Sub(m.countedAt) >= m.countTook*countBudget
	m.mu.Unlock()

	if count {
		start := m.now()
		var err error
		if perTenant, err = m.store.TenantBacklog(ctx); err != nil {
			return Status{}, false, fmt.Errorf("status: postgres backlog: %w", err)
		}
		m.mu.Lock()
		m.countedAt, m.countTook = start, m.now().Sub(start)
		m.mu.Unlock()
	}
	pg := lanesOf(perTenant)
	backlog := make(map[job.Priority]int64, len(job.Priorities))
	var total int64
	for _, lane := range job.Priorities {
		depth, err := m.inspector.Depth(ctx, lane)
		if err != nil {
			return Status{}, false, fmt.Errorf("status: broker depth of lane %s: %w", lane, err)
		}
		backlog[lane] = max(pg[lane], depth)
		total += backlog[lane]
	}
	now := m.now()
	if m.finishRate != nil {
		drain, drainAt = m.finishRate(), now
	} else if force || now.Sub(drainAt) >= drainEvery {
		var err error
		if drain, err = m.store.DrainRate(ctx, drainWindow); err != nil {
			return Status{}, false, fmt.Errorf("status: drain rate: %w", err)
		}
		drainAt = now
	}
	var tenantDrain map[string]float64
	if m.tenantRates != nil {
		tenantDrain = m.tenantRates()
	}
	st := Status{
		State:      stateFor(total, m.soft, m.hard),
		Backlog:    backlog,
		Total:      total,
		DrainRate:  drain,
		ETASeconds: eta(total, drain),
		SoftLimit:  m.soft,
		HardLimit:  m.hard,
		UpdatedAt:  now.UTC(),
	}

	m.mu.Lock()
	if count {
		// Rows committed before the count began are in it; the rest of
		// the admitted jobs (still inserting, or committed meanwhile) may
		// not be, and keep counting until the next.
		m.pending -= storedAtStart
		m.stored -= storedAtStart
		m.tenants.measured(perTenant, tenantStoredAtStart)
	}
	m.tenants.drained(tenantDrain)
	st.TenantStates = m.tenants.states(m.limits, m.soft, m.hard)
	changed := st.State != m.status.State || !maps.Equal(st.TenantStates, m.status.TenantStates)
	m.status = st
	m.drainAt = drainAt
	m.mu.Unlock()
	m.metrics.observeStatus(st)
	return st, changed, nil
}

// eta is backlog/drain in seconds to a tenth; 0 for an empty backlog, nil
// while nothing drains.
func eta(backlog int64, drain float64) *float64 {
	switch {
	case drain > 0:
		v := math.Round(float64(backlog)/drain*10) / 10
		return &v
	case backlog == 0:
		zero := 0.0
		return &zero
	}
	return nil
}

func (m *monitor) publish(ctx context.Context, st Status) {
	body, err := json.Marshal(st)
	if err != nil {
		m.log.Error("encode status", "error", err)
		return
	}
	if err := m.pub.PublishStatus(ctx, body); err != nil {
		m.log.Warn("publish status", "error", err, "state", st.State)
	}
}

// run refreshes every second and publishes on every state change and every
// interval, until ctx ends.
func (m *monitor) run(ctx context.Context) {
	refreshEvery := time.Second
	refreshTick := time.NewTicker(refreshEvery)
	defer refreshTick.Stop()
	publishTick := time.NewTicker(m.interval)
	defer publishTick.Stop()

	st, _, err := m.refresh(ctx, true)
	if err != nil {
		m.log.Warn("refresh back-pressure status", "error", err)
	} else {
		m.publish(ctx, st)
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-refreshTick.C:
			st, changed, err := m.refresh(ctx, false)
			if err != nil {
				if ctx.Err() == nil {
					m.log.Warn("refresh back-pressure status", "error", err)
				}
				continue
			}
			if changed {
				m.log.Info("back-pressure state changed", "state", st.State, "backlog", st.Total, "drain_rate", st.DrainRate, "tenant_states", st.TenantStates)
				m.publish(ctx, st)
			}
		case <-publishTick.C:
			m.publish(ctx, m.snapshot())
		}
	}
}
