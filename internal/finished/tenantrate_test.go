package finished

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// TestTenantRatesForgetQuietTenants: memory holds only the tenants that
// finished a job lately, however many names went by.
func TestTenantRatesForgetQuietTenants(t *testing.T) {
	now := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	tr := newTenantRates()
	for i := range 1000 {
		tr.add(fmt.Sprintf("t%d", i), now)
	}
	assert.Len(t, tr.m, 1000)
	now = now.Add(30 * time.Second)
	tr.add("steady", now)
	assert.Len(t, tr.m, 1001, "no sweep within the window")
	now = now.Add(40 * time.Second) // the 1000 are 70 s old, steady 40 s
	tr.add("steady", now)
	assert.Len(t, tr.m, 1, "the sweep dropped every tenant quiet for a window")
	assert.Equal(t, int64(2), tr.sum("steady", now))
	assert.Equal(t, map[string]int64{"steady": 2}, tr.sums(now))
}
