package flow

import (
	"sync"
	"time"
)

// Pacer is the guide's SmoothRateLimiter (docs/design.md#pacer): it
// enforces a minimum interval between sends. Reserve books the next send
// slot and returns how long to wait for it. Unlike the guide's, the first
// send does not wait.
//
// auto also spaces sends by their tokens (ReserveSpacing). That spacing
// runs on a schedule of its own, which aging and settlement move (Shift)
// and which may lag up to slack behind now: after a stall, sends come
// closer together until the token schedule has caught up. The interval is
// made up only for a caller's lateness (SetLateness), each booked slot
// still an interval after the last, so a per-second request limit paced by
// it stays safe.
type Pacer struct {
	mu       sync.Mutex
	interval time.Duration
	next     time.Time // earliest next send by the interval
	tokNext  time.Time // token schedule: earliest next send by the token gaps
	slack    time.Duration
	late     time.Duration // SetLateness
	// what the last reservation changed, for Cancel (the interval schedule
	// it set is lastAt + lastGap)
	prevNext, prevTok, setTok time.Time
	prevGap                   time.Duration
	// the last reservation, for Recheck and Cancel: its send time, the
	// earliest the interval allowed, its token gap and its interval gap
	lastAt, lastFloor time.Time
	lastSpacing       time.Duration
	lastGap           time.Duration
}

// SetSlack lets the token schedule make up for a stall (a caller held up
// elsewhere, say by a concurrency limit) of up to d. 0 never makes up.
func (p *Pacer) SetSlack(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.slack = d
}

// SetLateness lets a reservation that comes at most d after the interval's
// next slot take that slot, in the past, instead of now: the caller that
// was to book it woke late, and the schedule stays where it was rather
// than losing the lateness at every late wake. A reservation later than
// that (an idle pacer) starts from now, so no burst follows a pause. The
// interval between booked slots is kept either way. A token schedule that
// makes up nothing (no slack) still holds the send to now. SetLateness(0)
// turns it off.
func (p *Pacer) SetLateness(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.late = d
}

// NewPacer returns a pacer with the given minimum interval (0 = no pacing).
// The guide's SmoothRateLimiter(rate_per_minute=r) is NewPacer(time.Minute/r).
func NewPacer(interval time.Duration) *Pacer { return &Pacer{interval: interval} }

// Reserve books a send at max(now, previous send + interval), or at the
// latter up to the lateness before now (SetLateness).
func (p *Pacer) Reserve(now time.Time) time.Duration {
	return p.ReserveSpacing(now, 0)
}

// ReserveSpacing is Reserve for a send that must also be followed by a gap
// of spacing on the token schedule: a token-aware pacer gives a large
// request a gap proportional to its tokens.
func (p *Pacer) ReserveSpacing(now time.Time, spacing time.Duration) time.Duration {
	return p.ReserveGaps(now, 0, spacing)
}

// ReserveGaps is ReserveSpacing with a strict gap too: the next send comes
// at least max(interval, strict) after this one, and a strict gap is never
// made up, not even for lateness.
func (p *Pacer) ReserveGaps(now time.Time, strict, spacing time.Duration) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	tok := laterOf(p.tokNext, now.Add(-p.slack))
	floor := laterOf(now, p.next)
	if p.late > 0 && p.lastGap <= p.interval && strict <= p.interval &&
		now.After(p.next) && now.Sub(p.next) <= p.late {
		floor = p.next
	}
	at := laterOf(floor, tok)
	p.prevNext, p.prevTok, p.prevGap = p.next, p.tokNext, p.lastGap
	p.lastAt, p.lastFloor = at, floor
	p.lastSpacing, p.lastGap = spacing, max(p.interval, strict)
	p.next = at.Add(p.lastGap)
	p.tokNext = tok.Add(spacing)
	if p.slack == 0 {
		p.tokNext = at.Add(spacing)
	}
	p.setTok = p.tokNext
	return max(at.Sub(now), 0)
}

// Recheck returns the send time of the last reservation, moved earlier if
// Shift has since moved the token schedule earlier (answers shorter than
// booked): the one caller waiting for it goes sooner. The interval is kept.
// Only for the last reservation, with no other made since (auto's gate).
func (p *Pacer) Recheck(now time.Time) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	at := laterOf(laterOf(now, p.lastFloor), p.tokNext.Add(-p.lastSpacing))
	if at.Before(p.lastAt) {
		p.lastAt = at
		p.next = at.Add(p.lastGap)
	}
	return p.lastAt
}

// SentAt tells the pacer when the last reservation's send goes out. A send
// later than its slot (another limiter made it wait longer, as a warming-up
// bucket does) moves the interval's schedule with it: the next send keeps a
// full interval after this one. Otherwise the next slot is an interval after
// the earlier one, less than an interval after this send, and sends come as
// fast as the other limiter lets them, whose banked requests then put more
// than RPS of them in one second of the provider's. Only for the last
// reservation (auto's gate).
func (p *Pacer) SentAt(at time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if at.After(p.lastAt) {
		p.next = laterOf(p.next, at.Add(p.lastGap))
	}
}

// Cancel gives back the send booked by the last reservation, if nothing
// moved the pacer since, so a request that never went out does not delay
// the next.
func (p *Pacer) Cancel() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.next.Equal(p.lastAt.Add(p.lastGap)) && p.tokNext.Equal(p.setTok) {
		p.next, p.tokNext, p.lastGap = p.prevNext, p.prevTok, p.prevGap
	}
}

// Shift moves the token schedule by d: later for usage that was not booked,
// earlier (never more than the slack before now) for usage booked but not
// used.
func (p *Pacer) Shift(now time.Time, d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	floor := now.Add(-p.slack)
	p.tokNext = laterOf(p.tokNext, floor).Add(d)
	if p.tokNext.Before(floor) {
		p.tokNext = floor
	}
}

// Pull brings in a schedule booked under limits that have since gone up
// (a share of 0 given back): the next send at most an interval after the
// last one, the token schedule at most at now. A send booked while the
// interval was years long would otherwise hold every later one for as long.
func (p *Pacer) Pull(now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n := laterOf(p.lastAt, now).Add(p.interval); n.Before(p.next) {
		p.next = n
	}
	if p.tokNext.After(now) {
		p.tokNext = now
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
