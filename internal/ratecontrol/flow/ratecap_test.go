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
	c.OnRateLimit(now, sentBeforeCut, 0, true)
	// The last second is measured in 100 ms bins: 0.9 to 1 of the rate.
	cut := c.Scale(now)
	if cut < 0.6 || cut > 0.7 {
		t.Fatalf("scale after the first cut %.3f, want 0.7 × the utilisation", cut)
	}
	c.OnRateLimit(now.Add(time.Millisecond), sentBeforeCut, 0, true) // sent before the cut
	if s := c.Scale(now); s != cut {
		t.Fatalf("a 429 of a call sent before the cut cut again: %.3f", s)
	}
	// sent after the cut, into a provider second that still held the old rate
	c.OnRateLimit(now.Add(600*time.Millisecond), now.Add(500*time.Millisecond), 0, true)
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
	c.OnRateLimit(later.Add(200*time.Millisecond), later, 0, true)
	if s := c.Scale(later.Add(200 * time.Millisecond)); s > 0.1 {
		t.Fatalf("scale %.3f after a 429 at 10%% utilisation, want ≤ 0.07", s)
	}
}

// TestRateCapCutsFromWhatWasAdmitted: sends the provider refused are taken
// back, so a cut is relative to the rate it admitted, not the rate sent,
// and the cap then holds below that for rateCapHold instead of probing past
// it.
func TestRateCapCutsFromWhatWasAdmitted(t *testing.T) {
	t0 := time.Unix(2000, 0)
	full := 50 * time.Millisecond
	end := t0.Add(time.Second)
	capAfter := func(refuseEvery int) *RateCap {
		c := NewRateCap(t0.Add(-time.Second))
		for i := range 20 { // a second at the full rate, then a first cut
			c.Sent(t0.Add(time.Duration(i-20)*full), full)
		}
		c.OnRateLimit(t0, t0.Add(-time.Millisecond), full, true)
		for i := range 20 { // a second at the full rate again
			at := t0.Add(time.Duration(i) * full)
			c.Sent(at, full)
			if refuseEvery > 0 && i%refuseEvery == 0 {
				// refused within the second after the cut: taken back, no cut
				c.OnRateLimit(at.Add(5*time.Millisecond), at, full, true)
			}
		}
		c.OnRateLimit(end, end, full, true)
		return c
	}
	all, half := capAfter(0), capAfter(2)
	a, h := all.Scale(end), half.Scale(end)
	if h > rateCapBetaWM*0.5+0.01 || h >= a {
		t.Fatalf("scale %.3f after half the sends of the second were refused (none refused: %.3f), want ≤ %.3f",
			h, a, rateCapBetaWM*0.5)
	}
	later := end.Add(rateCapHold - time.Second)
	if h := half.Scale(later); h > rateCapHoldAt*0.5+0.01 {
		t.Fatalf("scale %.3f %v after a cut at a measured limit of 0.5, want held at ≤ %.3f", h, later.Sub(end), rateCapHoldAt*0.5)
	}
	if a := all.Scale(later); a <= rateCapHoldAt*0.5+0.01 {
		t.Fatalf("scale %.3f %v after a cut with nothing refused, want recovered past the hold level (test setup)", a, later.Sub(end))
	}
}

// TestRateCapAfterAHalving: the provider admits half the configured rate
// over a sliding second (a request limit: the long hold). Once a cut
// measured the limit, the cap holds below it for a probe hold (~50 s at 10
// calls a second) instead of probing past it (a 429 each time) every few
// seconds, while the admitted rate stays near the limit.
func TestRateCapAfterAHalving(t *testing.T) {
	t0 := time.Unix(3000, 0)
	const limit = 10 // per sliding second; the configured rate is 20
	full := 50 * time.Millisecond
	c := NewRateCap(t0)
	var admitted []time.Time
	var refusals []time.Time
	now, end := t0, t0.Add(70*time.Second)
	admittedLate := 0
	for now.Before(end) {
		n := 0
		for _, a := range admitted {
			if a.After(now.Add(-time.Second)) {
				n++
			}
		}
		c.Sent(now, full)
		if n < limit {
			admitted = append(admitted, now)
			if now.Sub(t0) >= 10*time.Second {
				admittedLate++
			}
		} else {
			refusals = append(refusals, now)
			c.OnRateLimit(now.Add(5*time.Millisecond), now, full, false)
		}
		now = now.Add(c.Spacing(now, full))
	}
	late := 0
	for _, r := range refusals {
		if r.Sub(t0) >= 10*time.Second {
			late++
		}
	}
	if late > 2 {
		t.Errorf("%d 429s in the 60 s after the limit was found (%v), want at most one per hold (one probe per ~50 s at 10 calls a second)", late, refusals)
	}
	if share := float64(admittedLate) / (60 * limit); share < 0.85 {
		t.Errorf("admitted %.1f%% of the limit over the 60 s, want ≥ 85%%", 100*share)
	}
}

// TestRateCapProbeHold: after a request or token 429 the cap holds below
// the measured limit long enough that probes past it cost at most
// rateCapProbeShare of the calls at the admitted rate; after a growth-rate
// 429 it probes again after rateCapHold.
func TestRateCapProbeHold(t *testing.T) {
	for _, tc := range []struct {
		calls float64
		want  time.Duration
	}{{10, 50 * time.Second}, {100, rateCapHold}, {0.01, rateCapMaxHold}, {0, rateCapMaxHold}} {
		if got := probeHold(tc.calls); got != tc.want {
			t.Errorf("probeHold(%v) = %v, want %v", tc.calls, got, tc.want)
		}
	}
	t0 := time.Unix(4000, 0)
	full := 50 * time.Millisecond // the configured rate is 20 calls a second
	capAt := func(growth bool) *RateCap {
		c := NewRateCap(t0.Add(-2 * time.Second))
		for i := range 20 { // a second at the full rate, then a first cut
			c.Sent(t0.Add(time.Duration(i-40)*full), full)
		}
		c.OnRateLimit(t0.Add(-time.Second), t0.Add(-time.Second-time.Millisecond), full, growth)
		for i := range 20 { // a second at the full rate, half of it refused
			at := t0.Add(time.Duration(i-20) * full)
			c.Sent(at, full)
			if i%2 == 1 { // within the second after the cut: taken back, no cut
				c.OnRateLimit(at.Add(5*time.Millisecond), at, full, growth)
			}
		}
		c.OnRateLimit(t0, t0, full, growth)
		return c
	}
	lasting, growth := capAt(false), capAt(true)
	wm := lasting.Scale(t0) / rateCapBetaWM
	// 8 to 10 calls a second admitted (read low: the bins hold 0.9 to 1 s,
	// and the cut's own bin has just started): the next probe comes 50 to
	// 63 s after the cut.
	if s := lasting.Scale(t0.Add(45 * time.Second)); s > rateCapHoldAt*wm+1e-9 {
		t.Errorf("request limit: scale %.3f 45 s after the cut, want held at ≤ %.3f", s, rateCapHoldAt*wm)
	}
	if s := lasting.Scale(t0.Add(70 * time.Second)); s <= wm {
		t.Errorf("request limit: scale %.3f 70 s after the cut, want probing past %.3f", s, wm)
	}
	if s := growth.Scale(t0.Add(rateCapHold + 5*time.Second)); s <= wm {
		t.Errorf("growth-rate limit: scale %.3f %v after the cut, want probing past %.3f", s, rateCapHold+5*time.Second, wm)
	}
}
