package flow

import (
	"math"
	"testing"
	"time"
)

// TestWarmupBucketWarmTo: a warm start at half the target rate issues at
// R/2 from then on and reaches R after the other half of the warm-up,
// with nothing banked for the skipped part of the ramp; a bucket already
// warmer is left alone.
func TestWarmupBucketWarmTo(t *testing.T) {
	t0 := time.Unix(1000, 0)
	const R, T = 100.0, 10 * time.Second
	w := NewWarmupBucket(6000, R, T, t0)
	if got := w.Warmth(t0.Add(time.Second)); got != 0 {
		t.Fatalf("warmth of a bucket nobody used = %v, want 0", got)
	}
	if !w.WarmTo(t0, 0.5) {
		t.Fatal("WarmTo(0.5) on a cold bucket reported no change")
	}
	if lvl := w.Level(t0); lvl != 0 {
		t.Fatalf("level right after the warm start = %v, want 0 (no burst)", lvl)
	}
	if got := w.Warmth(t0); got != 0 {
		t.Fatalf("warmth before the first reservation = %v, want 0", got)
	}
	w.Reserve(t0, 0)
	if got := w.Warmth(t0); math.Abs(got-0.5) > 1e-9 {
		t.Fatalf("warmth after WarmTo(0.5) and a reservation = %v, want 0.5", got)
	}
	// Issued over the next second: the integral of R·(0.5 + s/T) for s in
	// [0, 1] = 50 + 5 = 55.
	if lvl := w.Level(t0.Add(time.Second)); math.Abs(lvl-55) > 1e-6 {
		t.Fatalf("level one second after the warm start = %v, want 55", lvl)
	}
	if got := w.Warmth(t0.Add(5 * time.Second)); got != 1 {
		t.Fatalf("warmth 5 s after a warm start at 0.5 with T = 10 s = %v, want 1", got)
	}
	if w.WarmTo(t0.Add(5*time.Second), 0.8) {
		t.Fatal("WarmTo(0.8) on a warm bucket reported a change")
	}
}

// TestWarmupBucketWarmthAfterIdle: past the slow-start restart's idle the
// bucket reports no warmth, as its next reservation starts over.
func TestWarmupBucketWarmthAfterIdle(t *testing.T) {
	t0 := time.Unix(1000, 0)
	w := NewWarmupBucket(6000, 100, 10*time.Second, t0)
	w.SetIdleRestart(time.Minute)
	w.Reserve(t0.Add(20*time.Second), 1)
	if got := w.Warmth(t0.Add(30 * time.Second)); got != 1 {
		t.Fatalf("warmth 10 s after the last use = %v, want 1", got)
	}
	if got := w.Warmth(t0.Add(81 * time.Second)); got != 0 {
		t.Fatalf("warmth 61 s after the last use = %v, want 0", got)
	}
}

// TestWarmupBucketRampedCapacity: with a ramped capacity the bucket banks
// no more than its share of the ramp (the floor at the start, capacity·t/T
// later, the whole capacity once warm); without one it banks up to the
// guide's fixed capacity from the start.
func TestWarmupBucketRampedCapacity(t *testing.T) {
	t0 := time.Unix(1000, 0)
	const R, T, C = 1000.0, 10 * time.Second, 50.0
	ramped := NewWarmupBucket(C, R, T, t0)
	ramped.SetRampedCapacity(1)
	fixed := NewWarmupBucket(C, R, T, t0)
	for _, c := range []struct {
		at          time.Duration
		ramped, fix float64
	}{
		{100 * time.Millisecond, 0.5, 0.5}, // F = R·t²/(2T) = 0.5, below both
		{190 * time.Millisecond, 1, 1.805}, // F = 1.805; C·t/T = 0.95: the floor holds
		{time.Second, 5, 50},               // F = 50: ramped holds 50·1/10
		{4 * time.Second, 20, 50},
		{12 * time.Second, 50, 50}, // warm: the whole capacity
	} {
		now := t0.Add(c.at)
		if got := ramped.Level(now); math.Abs(got-c.ramped) > 1e-9 {
			t.Fatalf("ramped level at %v = %v, want %v", c.at, got, c.ramped)
		}
		if got := fixed.Level(now); math.Abs(got-c.fix) > 1e-9 {
			t.Fatalf("fixed level at %v = %v, want %v", c.at, got, c.fix)
		}
	}
}
