package ratecontrol

import (
	"sync"
	"time"
)

// Pacer is the seed's SmoothRateLimiter (traffic shaping, "Smoothing rate
// limiter"): it enforces a minimum interval between sends. Reserve books the
// next send slot and returns how long to wait for it. Unlike the seed, the
// first send does not wait.
type Pacer struct {
	mu       sync.Mutex
	interval time.Duration
	next     time.Time // earliest time of the next send
}

// NewPacer returns a pacer with the given minimum interval (0 = no pacing).
// The seed's SmoothRateLimiter(rate_per_minute=r) is NewPacer(time.Minute/r).
func NewPacer(interval time.Duration) *Pacer { return &Pacer{interval: interval} }

// Reserve books a send at max(now, previous send + interval).
func (p *Pacer) Reserve(now time.Time) time.Duration {
	return p.ReserveSpacing(now, 0)
}

// ReserveSpacing is Reserve for a send that must be followed by a gap of
// at least spacing (if longer than the interval): a token-aware pacer gives
// a large request a gap proportional to its tokens.
func (p *Pacer) ReserveSpacing(now time.Time, spacing time.Duration) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	at := now
	if p.next.After(at) {
		at = p.next
	}
	p.next = at.Add(max(p.interval, spacing))
	return at.Sub(now)
}

// Cancel gives back a send booked by ReserveSpacing(now, spacing) that
// returned wait, if it is still the last one, so a request that never went
// out does not delay the next.
func (p *Pacer) Cancel(now time.Time, wait, spacing time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	at := now.Add(wait)
	if p.next.Equal(at.Add(max(p.interval, spacing))) {
		p.next = at
	}
}

// SetInterval changes the minimum interval for the following sends.
func (p *Pacer) SetInterval(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.interval = d
}

// Interval reports the minimum interval.
func (p *Pacer) Interval() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.interval
}
