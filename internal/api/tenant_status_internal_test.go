package api

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/broker/memory"
	"github.com/llmq/llmq/internal/job"
)

// TestTenantAdmission: a tenant over its backlog_limit is refused with a
// Retry-After from its own drain rate, whatever the global rate; another
// tenant is admitted; the global limit still holds.
func TestTenantAdmission(t *testing.T) {
	m := &monitor{soft: 80, hard: 100, limits: map[string]int64{"flood": 10, "slow": 10}, tenants: newTenantSnapshot()}
	m.status = Status{Total: 40, DrainRate: 100}
	m.tenants.measured(map[string]map[job.Priority]int64{
		"flood": {job.PriorityNormal: 8, job.PriorityLow: 2},
		"slow":  {job.PriorityNormal: 10},
		"other": {job.PriorityHigh: 20},
	}, nil)
	m.tenants.drained(map[string]float64{"flood": 4, "other": 50})

	for _, tc := range []struct {
		name    string
		tenant  string
		n       int64
		ok      bool
		limited bool
		retry   time.Duration
	}{
		{"one over at 4 jobs/s", "flood", 1, false, true, time.Second},
		{"twenty over at 4 jobs/s", "flood", 20, false, true, 5 * time.Second}, // 10+20-10 over
		{"draining nothing", "slow", 1, false, true, noDrainRetryAfter},
		{"no limit of its own", "other", 1, true, false, 0},
		{"a new tenant", "new", 1, true, false, 0},
		{"over the global limit", "other", 61, false, false, time.Second}, // 40+61-100 = 1 at 100 jobs/s
	} {
		a := m.verdict(tc.tenant, tc.n)
		assert.Equal(t, tc.ok, a.ok, tc.name)
		assert.Equal(t, tc.limited, a.tenantLimit > 0, tc.name)
		if !tc.ok {
			assert.Equal(t, tc.retry, a.retryAfter, tc.name)
		}
	}

	// Admitted jobs count against the tenant until the next measurement.
	assert.True(t, m.admit("new", 1).ok)
	m.limits["new"] = 3
	assert.True(t, m.admit("new", 2).ok)
	a := m.admit("new", 1)
	assert.False(t, a.ok)
	assert.EqualValues(t, 3, a.backlog)
	m.release("new", 2)
	assert.True(t, m.admit("new", 1).ok)
}

func TestTenantState(t *testing.T) {
	for _, tc := range []struct {
		backlog, limit int64
		want           string
	}{
		{5, 0, StateOK}, {100, 0, StateOK},
		{19, 100, StateOK}, {20, 100, StateOK}, {21, 100, StateThrottled}, {99, 100, StateThrottled},
		{100, 100, StateFull}, {150, 100, StateFull},
		{0, 1, StateOK}, {1, 1, StateFull},
	} {
		assert.Equal(t, tc.want, tenantStateFor(tc.backlog, tc.limit, 10000, 50000), "%d of %d", tc.backlog, tc.limit)
	}
}

// countingStore answers TenantBacklog with a fixed backlog, taking took of
// the test's clock each time.
type countingStore struct {
	Store // nil: the monitor calls nothing else
	clock *time.Time
	took  time.Duration
	calls int
}

func (c *countingStore) TenantBacklog(context.Context) (map[string]map[job.Priority]int64, error) {
	c.calls++
	*c.clock = c.clock.Add(c.took)
	return map[string]map[job.Priority]int64{"acme": {job.PriorityNormal: 5}}, nil
}

// TestCountBudget: after a count that took d, the next waits d*countBudget
// (unless forced), and the jobs admitted meanwhile keep counting.
func TestCountBudget(t *testing.T) {
	clock := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	st := &countingStore{clock: &clock, took: 300 * time.Millisecond}
	mem := memory.New(memory.Config{})
	defer mem.Close()
	reg := prometheus.NewRegistry()
	met, err := newMetrics(reg)
	require.NoError(t, err)
	m := &monitor{store: st, inspector: mem.Inspector(), soft: 100, hard: 100, now: func() time.Time { return clock },
		metrics: met, limits: map[string]int64{"acme": 7}, tenants: newTenantSnapshot(), finishRate: func() float64 { return 0 }}
	ctx := context.Background()

	_, _, err = m.refresh(ctx, false)
	require.NoError(t, err)
	require.Equal(t, 1, st.calls)
	require.True(t, m.admit("acme", 2).ok)
	m.storedJobs("acme", 2)
	clock = clock.Add(time.Second) // 1.3 s after the count began: not due before 3 s
	_, _, err = m.refresh(ctx, false)
	require.NoError(t, err)
	assert.Equal(t, 1, st.calls, "not due")
	assert.False(t, m.admit("acme", 1).ok, "5 counted + 2 admitted since: at the limit of 7")
	clock = clock.Add(2 * time.Second)
	_, _, err = m.refresh(ctx, false)
	require.NoError(t, err)
	assert.Equal(t, 2, st.calls, "due")
	_, _, err = m.refresh(ctx, true)
	require.NoError(t, err)
	assert.Equal(t, 3, st.calls, "forced")
	assert.True(t, m.admit("acme", 2).ok, "the stored jobs left the count with the measurement: 5 + 2 fit")
}

// TestAdmittedJobStillInsertingKeepsCounting: a job admitted before a
// count began but committed after it is not in that count, so it keeps
// counting against its tenant's limit until a later count has seen it.
func TestAdmittedJobStillInsertingKeepsCounting(t *testing.T) {
	clock := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	counts := map[string]map[job.Priority]int64{}
	st := &fixedBacklog{counts: &counts}
	mem := memory.New(memory.Config{})
	defer mem.Close()
	met, err := newMetrics(prometheus.NewRegistry())
	require.NoError(t, err)
	m := &monitor{store: st, inspector: mem.Inspector(), soft: 100, hard: 100, now: func() time.Time { return clock },
		metrics: met, limits: map[string]int64{"support": 1}, tenants: newTenantSnapshot(), finishRate: func() float64 { return 0 }}
	ctx := context.Background()

	require.True(t, m.admit("support", 1).ok)
	_, _, err = m.refresh(ctx, true) // the row has not committed: the count is 0
	require.NoError(t, err)
	assert.False(t, m.admit("support", 1).ok, "the first job, still inserting, holds the limit")
	m.storedJobs("support", 1)
	counts = map[string]map[job.Priority]int64{"support": {job.PriorityNormal: 1}}
	_, _, err = m.refresh(ctx, true)
	require.NoError(t, err)
	a := m.admit("support", 1)
	assert.False(t, a.ok, "measured once, not twice and not never")
	assert.EqualValues(t, 1, a.backlog)
	counts = map[string]map[job.Priority]int64{}
	_, _, err = m.refresh(ctx, true)
	require.NoError(t, err)
	assert.True(t, m.admit("support", 1).ok, "finished: room again")
}

// fixedBacklog answers TenantBacklog with *counts.
type fixedBacklog struct {
	Store  // nil: the monitor calls nothing else
	counts *map[string]map[job.Priority]int64
}

func (f *fixedBacklog) TenantBacklog(context.Context) (map[string]map[job.Priority]int64, error) {
	return *f.counts, nil
}
