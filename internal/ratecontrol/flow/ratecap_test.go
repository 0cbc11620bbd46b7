package flow

import (
	"math"
	"testing"
	"time"
)

// TestRateCap: a 429 cuts the rate to β × what was sent in the last
// second; a 429 of a call sent before the cut, or within the second after
// it, does not cut again; the
// recovery never grows faster than 10% a second, plateaus near the rate of
// the cut and eventually lifts the cap.
func TestRateCap(t *testing.T) {
	t0 := time.Unix(1000, 0)
	c := NewRateCap(t0)
	if got := c.Spacing(t0, 50*time.Millisecond); got != 50*time.Millisecond {
		t.Fatalf("uncapped spacing %v", got)
	}
	// Send at the full rate for a second (20 sends of 50 ms each).
	now := t0
	for range 20 {
		c.Sent(now, 50*time.Millisecond)
		now = now.Add(50 * time.Millisecond)
	}
	sentBeforeCut := now.Add(-10 * time.Millisecond)
	c.OnRateLimit(now, sentBeforeCut)
	// The last second is measured in 100 ms bins: 0.9 to 1 of the rate.
	cut := c.Scale(now)
	if cut < 0.6 || cut > 0.7 {
		t.Fatalf("scale after the first cut %.3f, want 0.7 × the utilisation", cut)
	}
	c.OnRateLimit(now.Add(time.Millisecond), sentBeforeCut) // sent before the cut
	if s := c.Scale(now); s != cut {
		t.Fatalf("a 429 of a call sent before the cut cut again: %.3f", s)
	}
	// sent after the cut, into a provider second that still held the old rate
	c.OnRateLimit(now.Add(600*time.Millisecond), now.Add(500*time.Millisecond))
	if s := c.Scale(now); s != cut {
		t.Fatalf("a 429 within a second of the cut cut again: %.3f", s)
	}
	prev := c.Scale(now)
	for i := 1; i <= 200; i++ {
		at := now.Add(time.Duration(i) * 100 * time.Millisecond)
		s := c.Scale(at)
		if s > prev*math.Exp(0.1*0.1)+1e-9 {
			t.Fatalf("grew from %.4f to %.4f in 100ms", prev, s)
		}
		if s < prev {
			t.Fatalf("shrank without a 429: %.4f → %.4f", prev, s)
		}
		prev = s
	}
	if prev < 1 {
		t.Fatalf("scale %.3f 20 s after the cut, want the cap lifted", prev)
	}
	// After idle, a 429 cuts relative to what was actually sent.
	later := now.Add(time.Minute)
	c.Sent(later, 50*time.Millisecond)
	c.Sent(later.Add(100*time.Millisecond), 50*time.Millisecond)
	c.OnRateLimit(later.Add(200*time.Millisecond), later)
	if s := c.Scale(later.Add(200 * time.Millisecond)); s > 0.1 {
		t.Fatalf("scale %.3f after a 429 at 10%% utilisation, want ≤ 0.07", s)
	}
}
