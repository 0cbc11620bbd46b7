package webhook

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestBackoffSchedule(t *testing.T) {
	want := []time.Duration{5 * time.Second, 30 * time.Second, 2 * time.Minute, 5 * time.Minute, 15 * time.Minute,
		30 * time.Minute, time.Hour, 2 * time.Hour, 4 * time.Hour, 8 * time.Hour, 8 * time.Hour, 8 * time.Hour}
	for i, w := range want {
		assert.Equal(t, w, Backoff(i+1, 0.5), "after attempt %d, no jitter", i+1)
		assert.Equal(t, w*9/10, Backoff(i+1, 0), "after attempt %d, least", i+1)
		assert.InEpsilon(t, float64(w*11/10), float64(Backoff(i+1, 0.999999)), 1e-5, "after attempt %d, most", i+1)
	}
}

// TestRetryWindowAttempts counts the attempts of a delivery that never
// succeeds: 13 in the default window of 25h without jitter, the last at
// the window's end; 12 or 13 with any jitter.
func TestRetryWindowAttempts(t *testing.T) {
	count := func(r float64, window time.Duration) (int, time.Duration) {
		start := time.Unix(0, 0)
		deadline := start.Add(window)
		now, n := start, 0
		for {
			n++
			next, ok := nextAttempt(n, now, deadline, r)
			if !ok {
				return n, now.Sub(start)
			}
			now = next
		}
	}
	n, last := count(0.5, 25*time.Hour)
	assert.Equal(t, 13, n)
	assert.Equal(t, 25*time.Hour, last, "the last attempt is at the window's end")
	for _, r := range []float64{0, 0.999999} {
		n, last = count(r, 25*time.Hour)
		assert.Contains(t, []int{12, 13}, n, "r=%v", r)
		assert.Equal(t, 25*time.Hour, last)
	}
	// Attempt 12 comes at 23h52m35s, so the shortest window allowed still
	// gets its 13th at its end.
	n, last = count(0.5, 24*time.Hour)
	assert.Equal(t, 13, n)
	assert.Equal(t, 24*time.Hour, last)
}
