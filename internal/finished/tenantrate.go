package finished

import "time"

// tenantRates counts finishes per tenant. Memory stays bounded by the
// tenants that finished a job lately: a tenant whose window is empty is
// dropped at the next sweep (at most one sweep per rateWindow, on add), so
// a tenant name seen once costs its ring for at most two windows.
type tenantRates struct {
	m         map[string]*rate
	lastSweep time.Time
}

func newTenantRates() *tenantRates { return &tenantRates{m: map[string]*rate{}} }

func (t *tenantRates) add(tenant string, now time.Time) {
	if now.Sub(t.lastSweep) >= rateWindow {
		t.sweep(now)
	}
	r := t.m[tenant]
	if r == nil {
		r = &rate{}
		t.m[tenant] = r
	}
	r.add(now)
}

// sweep drops the tenants with no finish in the window ending at now.
func (t *tenantRates) sweep(now time.Time) {
	for name, r := range t.m {
		if r.sum(now) == 0 {
			delete(t.m, name)
		}
	}
	t.lastSweep = now
}

// sum is tenant's finishes in the window ending at now.
func (t *tenantRates) sum(tenant string, now time.Time) int64 {
	if r := t.m[tenant]; r != nil {
		return r.sum(now)
	}
	return 0
}

// sums is every tenant's finishes in the window ending at now, leaving out
// those with none.
func (t *tenantRates) sums(now time.Time) map[string]int64 {
	out := make(map[string]int64, len(t.m))
	for name, r := range t.m {
		if n := r.sum(now); n > 0 {
			out[name] = n
		}
	}
	return out
}
