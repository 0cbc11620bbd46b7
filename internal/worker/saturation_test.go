package worker

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// waitLoop runs waits back to back for one satWindow and more: each waits
// planned after it begins and ends actual after it begins, as a dispatcher
// that always has a job waits in Governor.Acquire.
func waitLoop(s *saturation, t0 time.Time, planned, actual time.Duration) time.Time {
	at := t0
	for at.Sub(t0) <= satWindow {
		s.begin(at)
		s.end(at.Add(actual), at.Add(planned))
		at = at.Add(actual)
	}
	return at
}

// A pacer that spaces sends 60 µs apart, far below its limit, waits 60 µs
// a call as planned, and a timer makes each wait ~1.08 ms: that is not a
// model whose quota binds.
func TestSaturationCountsThePlannedWaitNotTheTimersOversleep(t *testing.T) {
	var s saturation
	t0 := time.Unix(1_000_000, 0)
	end := waitLoop(&s, t0, 60*time.Microsecond, 1080*time.Microsecond)
	assert.False(t, s.saturated(end), "blocked share %.2f", s.last)
	assert.InDelta(t, 60.0/1080, s.last, 0.01)
}

// Waits the governor planned (the quota binds) count whole.
func TestSaturationCountsWaitsTheQuotaMakes(t *testing.T) {
	var s saturation
	t0 := time.Unix(1_000_000, 0)
	end := waitLoop(&s, t0, 5*time.Millisecond, 5*time.Millisecond+80*time.Microsecond)
	assert.True(t, s.saturated(end), "blocked share %.2f", s.last)
}

// A failed Acquire (no permit, planned zero) counts the whole wait, and one
// wait still in progress reads as saturated once a window closes.
func TestSaturationWithoutAPlan(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	var f saturation
	f.begin(t0)
	f.end(t0.Add(150*time.Millisecond), time.Time{})
	assert.True(t, f.saturated(t0.Add(160*time.Millisecond)))

	var g saturation
	g.begin(t0)
	assert.True(t, g.saturated(t0.Add(120*time.Millisecond)), "a wait in progress counts up to now")
}
