package flow

import (
	"sync"
	"time"
)

// Dimension names used by the Governor. Any other unit (audio seconds,
// images, concurrent tasks) is just another name.
const (
	DimRequests = "requests"
	DimTokens   = "tokens"
)

// Amount is a quantity of one dimension.
type Amount struct {
	Dim string
	N   float64
}

// Cost is what one call uses, one Amount per dimension.
type Cost []Amount

// Get returns the amount of dim (0 if absent).
func (c Cost) Get(dim string) float64 {
	for _, a := range c {
		if a.Dim == dim {
			return a.N
		}
	}
	return 0
}

// Admission is dual admission control (docs/design.md#dual-admission)
// generalised to named dimensions: one reservation books the cost on every limiter of every
// dimension at once and waits for the longest of their waits. Pre-deduct at
// admission (an estimate), then Settle with the actual usage, or Refund if
// the call never went out. A dimension may have several limiters (for
// example a per-minute and a per-second rule). Safe for concurrent use.
type Admission struct {
	mu            sync.Mutex
	dims          []dimension
	entryLimiters int
}

type dimension struct {
	name     string
	limiters []Limiter
}

// Reservation is a booked Cost. The zero value books nothing.
type Reservation struct {
	Cost Cost
	// Wait is how long after the reservation the call may go.
	Wait time.Duration
	// entries are the bookings of limiters that settle in place (WindowLog):
	// in place, for there is one such limiter, so a reservation allocates
	// nothing.
	entries [maxEntryLimiters]entryRef
	nent    int
	// hold is when the other limiters let the call go (Recheck keeps it).
	hold time.Time
}

// maxEntryLimiters is how many limiters that settle in place one
// admission may hold (auto has one: its TPM log).
const maxEntryLimiters = 2

type entryRef struct {
	l  entryLimiter
	id uint64
}

// NewAdmission returns an admission with no dimensions (admits everything).
func NewAdmission() *Admission { return &Admission{} }

// Add appends a limiter to dimension name. It panics past
// maxEntryLimiters limiters that settle in place (a Reservation holds their
// bookings in place).
func (a *Admission) Add(name string, l Limiter) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := l.(entryLimiter); ok {
		if a.entryLimiters == maxEntryLimiters {
			panic("flow: Admission.Add: too many limiters that settle in place")
		}
		a.entryLimiters++
	}
	for i := range a.dims {
		if a.dims[i].name == name {
			a.dims[i].limiters = append(a.dims[i].limiters, l)
			return
		}
	}
	a.dims = append(a.dims, dimension{name: name, limiters: []Limiter{l}})
}

// Limiters returns the limiters of dimension name (nil if none).
func (a *Admission) Limiters(name string) []Limiter {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, d := range a.dims {
		if d.name == name {
			return d.limiters
		}
	}
	return nil
}

// Reserve books cost on every limiter and returns the reservation whose
// Wait is the longest of the individual waits. Amounts of dimensions that
// have no limiter are recorded but limit nothing.
func (a *Admission) Reserve(now time.Time, cost Cost) Reservation {
	return a.ReserveAt(now, now, cost)
}

// ReserveAt is Reserve for a call that will not go before at (a pacer's
// slot). Limiters that settle in place book last, at the moment the others
// and at let the call go: that is when it will be sent, and where a
// provider counts it. The others book now, so their wait is the moment
// they allow, whatever moves at later (Recheck).
func (a *Admission) ReserveAt(now, at time.Time, cost Cost) Reservation {
	a.mu.Lock()
	defer a.mu.Unlock()
	r := Reservation{Cost: cost}
	for _, amt := range cost {
		a.eachLimiter(amt.Dim, func(l Limiter) {
			if _, ok := l.(entryLimiter); !ok {
				r.Wait = max(r.Wait, l.Reserve(now, amt.N))
			}
		})
	}
	r.hold = now.Add(r.Wait)
	from := laterOf(r.hold, at)
	r.Wait = from.Sub(now)
	for _, amt := range cost {
		a.eachLimiter(amt.Dim, func(l Limiter) {
			if el, ok := l.(entryLimiter); ok {
				w, id := el.reserveEntry(now, from, amt.N)
				r.entries[r.nent] = entryRef{el, id} // Add keeps nent in range
				r.nent++
				r.Wait = max(r.Wait, from.Sub(now)+w)
			}
		})
	}
	return r
}

func (a *Admission) eachLimiter(dim string, f func(Limiter)) {
	for _, d := range a.dims {
		if d.name == dim {
			for _, l := range d.limiters {
				f(l)
			}
		}
	}
}

// Recheck moves r's bookings in limiters that settle in place to the
// earliest moment from earliest on where they fit now, and returns r's
// wait from now: a call waiting for room that answers shorter than booked
// have freed goes sooner. Only the last booking of a limiter can move (the
// one waiting call, under auto's gate); other limiters keep their wait.
func (a *Admission) Recheck(now, earliest time.Time, r Reservation) time.Duration {
	a.mu.Lock()
	defer a.mu.Unlock()
	wait := r.hold.Sub(now)
	for _, e := range r.entries[:r.nent] {
		wait = max(wait, e.l.rebookEntry(now, laterOf(earliest, r.hold), e.id))
	}
	return max(wait, 0)
}

// Refund gives back everything r booked (the call never went out).
func (a *Admission) Refund(now time.Time, r Reservation) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, amt := range r.Cost {
		if amt.N != 0 {
			a.adjustRes(now, r, amt.Dim, amt.N)
		}
	}
}

// Settle replaces the booked cost by the actual one: each dimension present
// in actual is adjusted by booked − actual (a negative adjustment is debt
// that later callers wait for). Dimensions absent from actual keep their
// booking.
func (a *Admission) Settle(now time.Time, r Reservation, actual Cost) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, act := range actual {
		delta := r.Cost.Get(act.Dim) - act.N
		if delta != 0 {
			a.adjustRes(now, r, act.Dim, delta)
		}
	}
}

// AdjustReservation adds delta to every limiter of dim on behalf of r: a
// limiter that settles in place corrects r's own booking.
func (a *Admission) AdjustReservation(now time.Time, r Reservation, dim string, delta float64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.adjustRes(now, r, dim, delta)
}

func (a *Admission) adjustRes(now time.Time, r Reservation, dim string, delta float64) {
	for _, d := range a.dims {
		if d.name != dim {
			continue
		}
	next:
		for _, l := range d.limiters {
			for _, e := range r.entries[:r.nent] {
				if e.l == l {
					e.l.adjustEntry(now, e.id, delta)
					continue next
				}
			}
			l.Adjust(now, delta)
		}
	}
}

// Adjust adds delta to every limiter of dim.
func (a *Admission) Adjust(now time.Time, dim string, delta float64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.adjustDim(now, dim, delta)
}

func (a *Admission) adjustDim(now time.Time, dim string, delta float64) {
	for _, d := range a.dims {
		if d.name == dim {
			for _, l := range d.limiters {
				l.Adjust(now, delta)
			}
		}
	}
}

// Clamp lowers the level of the first (per-minute) limiter of dim to max.
func (a *Admission) Clamp(now time.Time, dim string, max float64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, d := range a.dims {
		if d.name == dim && len(d.limiters) > 0 {
			d.limiters[0].Clamp(now, max)
		}
	}
}

// Levels returns, per dimension, the lowest level of its limiters.
func (a *Admission) Levels(now time.Time) map[string]float64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make(map[string]float64, len(a.dims))
	for _, d := range a.dims {
		for i, l := range d.limiters {
			if v := l.Level(now); i == 0 || v < out[d.name] {
				out[d.name] = v
			}
		}
	}
	return out
}
