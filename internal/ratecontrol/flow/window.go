package flow

import (
	"sync"
	"time"
)

// WindowLog is a sliding-window limiter that counts tokens the way a
// provider does: each call is booked at its send time, and everything
// learned about it later (aging, settlement, a refund) corrects that same
// booking, where the provider counted it. At most limit units are booked in
// any window (t−window, t].
//
// Why not a token bucket for auto's TPM: a bucket can only move its level
// now. Settling a call that used more than booked lands after the minute
// the provider charged it to; refunding one that used less frees room in a
// minute that never held it. Both let a sliding minute hold more than TPM
// once answers of unknown length last seconds. The log has no such gap:
// what remains unknown is only the output of the calls still in flight.
//
// Reservations queue FIFO like a bucket's debt: a call that does not fit is
// booked at the moment enough older bookings leave the window, and later
// calls queue behind it. Safe for concurrent use.
type WindowLog struct {
	mu     sync.Mutex
	window time.Duration
	guard  time.Duration // bookings leave window+guard after they were made
	limit  float64
	base   uint64     // id of ents[0]
	ents   []logEntry // ascending at; ents[lo:] are kept, ents[head:] are in the window
	lo     int        // bookings out of the window are kept a while for ClampAt
	head   int
	sum    float64 // Σ n of ents[head:]
}

// logEntry is one booking; at is Unix nanoseconds, so the log holds no
// pointers for the garbage collector to scan.
type logEntry struct {
	at int64
	n  float64
}

var _ entryLimiter = (*WindowLog)(nil)

// entryLimiter is a Limiter whose later corrections can be attributed to
// the reservation they correct (Admission keeps the id in the Reservation).
type entryLimiter interface {
	Limiter
	reserveEntry(now, at time.Time, n float64) (time.Duration, uint64)
	adjustEntry(now time.Time, id uint64, delta float64)
	rebookEntry(now, earliest time.Time, id uint64) time.Duration
}

// NewWindowLog returns an empty log allowing limit units per window.
func NewWindowLog(window time.Duration, limit float64) *WindowLog {
	return &WindowLog{window: window, limit: limit}
}

// SetGuard keeps each booking in the log d longer than the window: room a
// booking leaves is given to a new call only d after the provider's window
// has moved past it, for calls whose trip to the provider is faster than
// the old one's was.
func (w *WindowLog) SetGuard(d time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.guard = max(d, 0)
}

// prune moves bookings no window ending at now or later can hold out of the
// window, and drops those older than a window more.
func (w *WindowLog) prune(now time.Time) {
	cut := now.Add(-w.window - w.guard).UnixNano()
	for w.head < len(w.ents) && w.ents[w.head].at <= cut {
		w.sum -= w.ents[w.head].n
		w.head++
	}
	if w.head == len(w.ents) {
		w.sum = 0 // no float drift survives an empty window
	}
	keep := cut - int64(w.window)
	for w.lo < w.head && w.ents[w.lo].at <= keep {
		w.lo++
	}
	if w.lo >= 64 && 2*w.lo >= len(w.ents) {
		// compact: amortised O(1) per booking
		n := copy(w.ents, w.ents[w.lo:])
		w.base += uint64(w.lo)
		w.ents, w.head, w.lo = w.ents[:n], w.head-w.lo, 0
	}
}

// tail is the earliest time a new booking may take: now, or later when
// earlier reservations were booked ahead (FIFO).
func (w *WindowLog) tail(now time.Time) int64 {
	t := now.UnixNano()
	if n := len(w.ents); n > w.head && w.ents[n-1].at > t {
		return w.ents[n-1].at
	}
	return t
}

// reserveEntry books n units for a call that goes at at or later, and
// returns the wait from at and the booking's id. (Pruning goes by now, not
// at: a booking ahead of now may still move earlier, and bookings that a
// window ending at at no longer holds may still be settled.)
func (w *WindowLog) reserveEntry(now, at time.Time, n float64) (time.Duration, uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.prune(now)
	from := max(w.tail(now), at.UnixNano())
	t := w.fit(from, n)
	w.ents = append(w.ents, logEntry{at: t, n: n})
	w.sum += n
	return time.Duration(t - at.UnixNano()), w.base + uint64(len(w.ents)-1)
}

// fit is the earliest moment from on where n more units fit: when the
// oldest bookings worth the excess have left the window (a call larger than
// the whole limit waits for an empty window).
func (w *WindowLog) fit(from int64, n float64) int64 {
	need := w.sum + n - w.limit
	if need <= 0 || w.head == len(w.ents) {
		return from // fits, or too large for any window and this one is empty
	}
	var acc float64
	leave := w.ents[len(w.ents)-1].at
	for _, e := range w.ents[w.head:] {
		acc += e.n
		if acc >= need {
			leave = e.at
			break
		}
	}
	return max(from, leave+int64(w.window+w.guard))
}

// rebookEntry moves booking id, if it is the last one and still ahead of
// now, to the earliest moment from earliest on where it fits now: room
// freed since it was booked (an answer shorter than booked, a refund) lets
// a waiting call go sooner. It returns the booking's wait from now.
func (w *WindowLog) rebookEntry(now, earliest time.Time, id uint64) time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.prune(now)
	last := len(w.ents) - 1
	if last < w.head || id != w.base+uint64(last) {
		if i, ok := w.index(id); ok {
			return time.Duration(w.ents[i].at - now.UnixNano())
		}
		return 0
	}
	e := w.ents[last]
	w.ents, w.sum = w.ents[:last], w.sum-e.n
	e.at = min(e.at, w.fit(max(w.tail(now), earliest.UnixNano()), e.n))
	w.ents = append(w.ents, e)
	w.sum += e.n
	return time.Duration(e.at - now.UnixNano())
}

// index is where booking id is in ents, if the log still keeps it.
func (w *WindowLog) index(id uint64) (int, bool) {
	if id < w.base+uint64(w.lo) || id-w.base >= uint64(len(w.ents)) {
		return 0, false
	}
	return int(id - w.base), true
}

// adjustEntry corrects booking id by delta (positive gives units back).
// A booking already out of every window is left alone: the provider's
// windows have moved past it too.
func (w *WindowLog) adjustEntry(now time.Time, id uint64, delta float64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	i, ok := w.index(id)
	if !ok {
		return
	}
	e := &w.ents[i]
	next := max(e.n-delta, 0)
	if i >= w.head {
		w.sum += next - e.n
	}
	e.n = next
}

// sumAt is what the window (t−window, t] held (t at most a window back).
// The log's own sum runs over the guarded window ending now.
func (w *WindowLog) sumAt(t int64) float64 {
	s := w.sum
	for i := len(w.ents) - 1; i >= w.head && w.ents[i].at > t; i-- {
		s -= w.ents[i].n
	}
	from := t - int64(w.window)
	for i := w.head; i < len(w.ents) && w.ents[i].at <= from; i++ {
		s -= w.ents[i].n // in the guard band
	}
	for i := w.head - 1; i >= w.lo && w.ents[i].at > from; i-- {
		s += w.ents[i].n
	}
	return s
}

// SumAt is what the window ending at t held (0 when t is more than a
// window before now).
func (w *WindowLog) SumAt(now, t time.Time) float64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.prune(now)
	if t.Before(now.Add(-w.window)) {
		return 0
	}
	return w.sumAt(t.UnixNano())
}

// ClampAt books what it takes for the window ending at t (a past moment, at
// most a window back) to have held at most max units of room: a provider's
// x-ratelimit-remaining-tokens is its count when it admitted a call, not
// when the answer arrives, and that call's minute is where the log must
// agree with it. The difference is booked now, since the log only appends.
func (w *WindowLog) ClampAt(now, t time.Time, max float64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.prune(now)
	at := t.UnixNano()
	if at < now.Add(-w.window).UnixNano() || at > now.UnixNano() {
		return
	}
	if rem := w.limit - w.sumAt(at); rem > max {
		w.book(now, rem-max)
	}
}

// Reserve books n units and returns the wait.
func (w *WindowLog) Reserve(now time.Time, n float64) time.Duration {
	d, _ := w.reserveEntry(now, now, n)
	return d
}

// Adjust books −delta units at now (or at the last booking, if later),
// for corrections that belong to no reservation.
func (w *WindowLog) Adjust(now time.Time, delta float64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.prune(now)
	w.book(now, -delta)
}

func (w *WindowLog) book(now time.Time, n float64) {
	at := w.tail(now)
	if k := len(w.ents); k > w.head && w.ents[k-1].at == at && n < 0 {
		// never leave a negative booking: fold it into the last one
		n = max(n, -w.ents[k-1].n)
		w.ents[k-1].n += n
		w.sum += n
		return
	}
	if n <= 0 {
		return
	}
	w.ents = append(w.ents, logEntry{at: at, n: n})
	w.sum += n
}

// Clamp books what it takes for at most max units to remain.
func (w *WindowLog) Clamp(now time.Time, max float64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.prune(now)
	if rem := w.limit - w.sum; rem > max {
		w.book(now, rem-max)
	}
}

// Level is the units a window ending now could still take (negative when
// bookings were made ahead).
func (w *WindowLog) Level(now time.Time) float64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.prune(now)
	return w.limit - w.sum
}

// SetLimit changes the limit as a new quota (a replica's share of one that
// several share, say). A lower limit scales the bookings down with it, so
// the log is as full as before and sends go on at the new rate at once:
// the old bookings were made under the old share, and the other replicas'
// shares grew by what this one lost. Without that, a replica whose share
// shrank by a third would send nothing for 20 s while the minute drained,
// and the replicas together would leave the quota unused. A higher limit
// keeps the bookings: the room is there at once.
func (w *WindowLog) SetLimit(now time.Time, limit float64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.prune(now)
	if limit < w.limit && w.limit > 0 {
		f := max(limit, 0) / w.limit
		for i := w.lo; i < len(w.ents); i++ {
			w.ents[i].n *= f
		}
		w.sum *= f
	}
	w.limit = limit
}

// SetRate sets the limit to perSecond × window. A log needs no burst
// capacity (it never lets more than the limit into a window), so capacity
// is ignored.
func (w *WindowLog) SetRate(now time.Time, _, perSecond float64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.limit = perSecond * w.window.Seconds()
}
