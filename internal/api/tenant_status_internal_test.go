package api

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

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
	}, map[string]float64{"flood": 4, "other": 50}, nil)

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
