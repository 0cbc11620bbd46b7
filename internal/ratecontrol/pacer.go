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
	slack    time.Duration
}

// SetSlack lets the pacer make up for a stall: after a pause (a caller held
// up elsewhere, say by a concurrency limit) sends may follow each other
// closer than the interval until the pacer is back on schedule, for up to
// slack of lost time. 0 (the seed's behaviour) never makes up.
func (p *Pacer) SetSlack(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.slack = d
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
	} else if p.slack > 0 {
		// book from the missed slot, at most slack back: the next sends
		// come sooner until the schedule has caught up with now
		at = laterOf(p.next, now.Add(-p.slack))
	}
	p.next = at.Add(max(p.interval, spacing))
	return max(at.Sub(now), 0)
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

// Shift moves the next free send time by d: later for usage that was not
// booked, earlier (never more than the slack before now) for usage booked
// but not used.
func (p *Pacer) Shift(now time.Time, d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	floor := now.Add(-p.slack)
	p.next = laterOf(p.next, floor).Add(d)
	if p.next.Before(floor) {
		p.next = floor
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

func laterOf(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
