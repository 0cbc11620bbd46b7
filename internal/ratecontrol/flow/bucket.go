package flow

import (
	"math"
	"sync"
	"time"
)

// Limiter is one rate rule of one dimension: a token bucket, a warm-up
// bucket, or anything that books amounts against a refilling budget. Every
// method takes the current time, so a Limiter is pure and testable without
// a clock. Implementations are safe for concurrent use.
type Limiter interface {
	// Reserve books n units now (the level may go negative: FIFO debt) and
	// returns how long the caller must wait before it may use them.
	Reserve(now time.Time, n float64) time.Duration
	// Adjust adds delta to the level (a refund is positive, settling a
	// larger actual usage is negative). The level never exceeds capacity.
	Adjust(now time.Time, delta float64)
	// Clamp lowers the level to at most max (corrections from the provider).
	Clamp(now time.Time, max float64)
	// Level is the current level (negative while in debt).
	Level(now time.Time) float64
	// SetRate changes capacity and refill rate (per second) from now on,
	// keeping the current level (clipped to the new capacity).
	SetRate(now time.Time, capacity, perSecond float64)
}

// Bucket is the guide's token bucket (docs/design.md#token-bucket): a
// capacity, a constant refill rate, initial tokens (full start for online
// services, empty start for a slow start) and FIFO debt: a reservation that
// cannot be met books the deficit against future refill and returns its
// wait, so later callers queue behind it.
type Bucket struct {
	mu       sync.Mutex
	capacity float64
	rate     float64 // tokens per second
	tokens   float64
	last     time.Time
}

var _ Limiter = (*Bucket)(nil)

// NewBucket returns a bucket holding initial tokens at now. perSecond must
// be > 0; a per-minute quota Q is NewBucket(Q, Q/60, initial, now).
func NewBucket(capacity, perSecond, initial float64, now time.Time) *Bucket {
	return &Bucket{capacity: capacity, rate: perSecond, tokens: math.Min(initial, capacity), last: now}
}

// refill is the guide's _refill: add elapsed*rate, capped at capacity.
// Time never moves backwards for the bucket.
func (b *Bucket) refill(now time.Time) {
	if elapsed := now.Sub(b.last); elapsed > 0 {
		b.tokens = math.Min(b.capacity, b.tokens+elapsed.Seconds()*b.rate)
		b.last = now
	}
}

// Reserve is the guide's reserve(cost) with now passed in.
func (b *Bucket) Reserve(now time.Time, n float64) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	return seconds(b.reserve(now, n))
}

func (b *Bucket) reserve(now time.Time, n float64) float64 {
	b.refill(now)
	if b.tokens >= n {
		b.tokens -= n
		return 0
	}
	deficit := n - b.tokens
	b.tokens -= n
	return deficit / b.rate
}

// Adjust is the guide's adjust(amount): refund (positive) or settle
// (negative), after a refill (the guide adds to a stale level, which can
// waste refill at the capacity cap; docs/design.md#departures).
func (b *Bucket) Adjust(now time.Time, delta float64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refill(now)
	b.tokens = math.Min(b.capacity, b.tokens+delta)
}

// Clamp lowers the level to at most max.
func (b *Bucket) Clamp(now time.Time, max float64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refill(now)
	b.tokens = math.Min(b.tokens, max)
}

// Level reports the tokens available at now (negative while in debt).
func (b *Bucket) Level(now time.Time) float64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refill(now)
	return b.tokens
}

// SetRate changes capacity and rate from now on.
func (b *Bucket) SetRate(now time.Time, capacity, perSecond float64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refill(now)
	b.capacity, b.rate = capacity, perSecond
	b.tokens = math.Min(b.tokens, capacity)
}

// seconds converts a wait in seconds to a Duration, rounding up so that a
// caller never goes early (a wait is at most 1 ns longer than exact).
func seconds(s float64) time.Duration {
	if s <= 0 {
		return 0
	}
	if s >= math.MaxInt64/1e9 {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(math.Ceil(s * 1e9))
}
