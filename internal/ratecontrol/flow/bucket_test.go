package flow

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// pyTokenBucket transcribes the guide's Python token bucket
// (docs/design.md#token-bucket) with time.monotonic() replaced by t.
type pyTokenBucket struct{ capacity, tokens, refillRate, lastRefill float64 }

func newPyTokenBucket(quotaPerMinute, initialTokens, t float64) *pyTokenBucket {
	return &pyTokenBucket{capacity: quotaPerMinute, tokens: initialTokens, refillRate: quotaPerMinute / 60.0, lastRefill: t}
}

func (b *pyTokenBucket) reserve(t, cost float64) float64 {
	b.refill(t)
	if b.tokens >= cost {
		b.tokens -= cost
		return 0.0
	}
	deficit := cost - b.tokens
	waitSeconds := deficit / b.refillRate
	b.tokens -= cost
	return waitSeconds
}

func (b *pyTokenBucket) refill(now float64) {
	elapsed := now - b.lastRefill
	if elapsed > 0 {
		b.tokens = math.Min(b.capacity, b.tokens+elapsed*b.refillRate)
		b.lastRefill = now
	}
}

// pyWarmupBucket transcribes the guide's Python token bucket with
// continuous warm-up (docs/design.md#warm-up).
type pyWarmupBucket struct {
	capacity, tokens, targetRefillRate, warmupSeconds, startTime, lastUpdateTime, cumulativeGenerated float64
}

func newPyWarmupBucket(quotaPerMinute, warmupSeconds, t float64) *pyWarmupBucket {
	return &pyWarmupBucket{capacity: quotaPerMinute, targetRefillRate: quotaPerMinute / 60.0,
		warmupSeconds: warmupSeconds, startTime: t, lastUpdateTime: t}
}

func (b *pyWarmupBucket) getCumulativeTokens(t float64) float64 {
	if t <= 0 {
		return 0.0
	}
	R, T := b.targetRefillRate, b.warmupSeconds
	if T <= 0 {
		return R * t
	}
	if t <= T {
		return (R / (2 * T)) * (t * t)
	}
	warmupTotal := (R * T) / 2.0
	return warmupTotal + R*(t-T)
}

func (b *pyWarmupBucket) getTimeForCumulativeTokens(target float64) float64 {
	if target <= 0 {
		return 0.0
	}
	R, T := b.targetRefillRate, b.warmupSeconds
	if T <= 0 {
		return target / R
	}
	warmupTotal := (R * T) / 2.0
	if target <= warmupTotal {
		return math.Pow((2*T*target)/R, 0.5)
	}
	return (target-warmupTotal)/R + T
}

func (b *pyWarmupBucket) reserve(now, cost float64) float64 {
	relativeNow := now - b.startTime
	current := b.getCumulativeTokens(relativeNow)
	newTokens := current - b.cumulativeGenerated
	b.tokens = math.Min(b.capacity, b.tokens+newTokens)
	b.cumulativeGenerated = current
	b.lastUpdateTime = now
	if b.tokens >= cost {
		b.tokens -= cost
		return 0.0
	}
	deficit := cost - b.tokens
	b.tokens -= cost
	target := b.cumulativeGenerated + deficit
	return math.Max(0.0, b.getTimeForCumulativeTokens(target)-relativeNow)
}

// call is one step of a generated call sequence.
type call struct {
	at   time.Duration
	cost float64
}

func genCalls(seed uint64, n int, meanGap time.Duration, maxCost float64) []call {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	var at time.Duration
	out := make([]call, n)
	for i := range out {
		if r.IntN(4) > 0 { // a quarter of the calls arrive at the same instant
			at += time.Duration(r.Float64() * 2 * float64(meanGap))
		}
		out[i] = call{at: at, cost: 1 + math.Floor(r.Float64()*maxCost)}
	}
	return out
}

func TestBucketMatchesGuideReference(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	cases := []struct {
		name           string
		quota, initial float64
		meanGap        time.Duration
		maxCost        float64
		calls          int
		seed           uint64
	}{
		{"rpm full start, overload", 600, 600, 50 * time.Millisecond, 1, 5000, 1},
		{"rpm empty start, underload", 600, 0, 200 * time.Millisecond, 1, 5000, 2},
		{"tpm mixed costs", 90_000, 0, 1200 * time.Millisecond, 4000, 5000, 3},
		{"tpm half start", 1_000_000, 500_000, 800 * time.Millisecond, 30_000, 5000, 4},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := NewBucket(tc.quota, tc.quota/60, tc.initial, t0)
			pub := NewBucket(tc.quota, tc.quota/60, tc.initial, t0)
			py := newPyTokenBucket(tc.quota, tc.initial, 0)
			for i, c := range genCalls(tc.seed, tc.calls, tc.meanGap, tc.maxCost) {
				now := t0.Add(c.at)
				got := b.reserve(now, c.cost)
				want := py.reserve(c.at.Seconds(), c.cost)
				if math.Abs(got-want) > 1e-9 {
					t.Fatalf("call %d at %v cost %v: wait %.12f s, guide's reference %.12f s", i, c.at, c.cost, got, want)
				}
				checkRoundedUp(t, i, pub.Reserve(now, c.cost), want)
			}
		})
	}
}

func TestWarmupBucketMatchesGuideReference(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	cases := []struct {
		name    string
		quota   float64
		warmup  time.Duration
		meanGap time.Duration
		maxCost float64
		calls   int
		seed    uint64
	}{
		{"rpm 30s warm-up overload", 600, 30 * time.Second, 50 * time.Millisecond, 1, 5000, 5},
		{"rpm 30s warm-up underload", 600, 30 * time.Second, 300 * time.Millisecond, 1, 3000, 6},
		{"tpm 60s warm-up", 1_000_000, time.Minute, 500 * time.Millisecond, 20_000, 5000, 7},
		{"no warm-up", 600, 0, 80 * time.Millisecond, 1, 5000, 8},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := NewWarmupBucket(tc.quota, tc.quota/60, tc.warmup, t0)
			pub := NewWarmupBucket(tc.quota, tc.quota/60, tc.warmup, t0)
			py := newPyWarmupBucket(tc.quota, tc.warmup.Seconds(), 0)
			for i, c := range genCalls(tc.seed, tc.calls, tc.meanGap, tc.maxCost) {
				got := w.reserve(t0.Add(c.at), c.cost)
				want := py.reserve(c.at.Seconds(), c.cost)
				if math.Abs(got-want) > 1e-9 {
					t.Fatalf("call %d at %v cost %v: wait %.12f s, guide's reference %.12f s", i, c.at, c.cost, got, want)
				}
				checkRoundedUp(t, i, pub.Reserve(t0.Add(c.at), c.cost), want)
			}
		})
	}
}

// checkRoundedUp: the public Duration is the reference wait rounded up to
// the nanosecond (never early, at most 1 ns late, plus float rounding of
// the conversion).
func checkRoundedUp(t *testing.T, i int, d time.Duration, want float64) {
	t.Helper()
	if diff := d.Seconds() - want; diff < -1e-9 || diff > 2e-9 {
		t.Fatalf("call %d: public wait %v, guide's reference %.12f s", i, d, want)
	}
}

func TestSecondsRoundsUp(t *testing.T) {
	for _, s := range []float64{0, -1, 1e-10, 0.1, 1.0000000001, 59.99999999999} {
		d := seconds(s)
		if d.Seconds() < s || (s > 0 && d.Seconds()-s > 1e-9+1e-15*s) {
			t.Errorf("seconds(%v) = %v", s, d)
		}
	}
}

func TestBucketDebtRefundSettle(t *testing.T) {
	t0 := time.Unix(0, 0)
	b := NewBucket(600, 10, 0, t0) // 10 tokens/s, empty
	if w := b.Reserve(t0, 1); w != 100*time.Millisecond {
		t.Fatalf("first wait %v, want 100ms", w)
	}
	if w := b.Reserve(t0, 1); w != 200*time.Millisecond {
		t.Fatalf("second wait %v, want 200ms (FIFO debt)", w)
	}
	b.Adjust(t0, 1) // refund the second: the next caller takes its place
	if w := b.Reserve(t0, 1); w != 200*time.Millisecond {
		t.Fatalf("after refund wait %v, want 200ms", w)
	}
	b.Adjust(t0, -5) // settle: 5 more used than booked
	if w := b.Reserve(t0, 1); w != 800*time.Millisecond {
		t.Fatalf("after settle wait %v, want 800ms", w)
	}
	if lvl := b.Level(t0.Add(10 * time.Second)); math.Abs(lvl-92) > 1e-9 {
		t.Fatalf("level %v, want 92", lvl)
	}
	if lvl := b.Level(t0.Add(time.Hour)); lvl != 600 {
		t.Fatalf("level %v, want capacity 600", lvl)
	}
}
