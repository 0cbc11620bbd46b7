package sim

// event is one admitted request: when, and the running total of tokens
// admitted up to and including it.
type event struct {
	t   int64 // unix nanoseconds
	cum int64
}

// eventLog is a model's admission history: a growable ring of events in
// admission order. Every sliding window (60 s, 1 s, the burst rule's
// history) is answered exactly from it: counts by index difference and
// token sums by difference of the running total, both found by binary
// search, so "the last 60 s" means exactly (now-60s, now].
type eventLog struct {
	ring  []event
	head  int   // index in ring of the oldest event
	n     int   // events held
	total int64 // running token total after the newest event
	base  int64 // running token total before the oldest held event
}

func (l *eventLog) at(i int) event { return l.ring[(l.head+i)%len(l.ring)] }

// last returns the time of the newest event, or 0 when empty.
func (l *eventLog) last() int64 {
	if l.n == 0 {
		return 0
	}
	return l.at(l.n - 1).t
}

func (l *eventLog) push(t, tokens int64) {
	if l.n == len(l.ring) {
		grown := make([]event, max(64, 2*len(l.ring)))
		k := copy(grown, l.ring[l.head:])
		copy(grown[k:], l.ring[:l.head])
		l.ring, l.head = grown, 0
	}
	l.total += tokens
	l.ring[(l.head+l.n)%len(l.ring)] = event{t: t, cum: l.total}
	l.n++
}

// evict drops the events at or before t.
func (l *eventLog) evict(t int64) {
	for l.n > 0 {
		e := l.ring[l.head]
		if e.t > t {
			return
		}
		l.base = e.cum
		l.head = (l.head + 1) % len(l.ring)
		l.n--
	}
}

// firstAfter is the logical index of the oldest event later than t (n if none).
func (l *eventLog) firstAfter(t int64) int {
	lo, hi := 0, l.n
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if l.at(mid).t <= t {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo
}

// cumBefore is the running token total before logical index i.
func (l *eventLog) cumBefore(i int) int64 {
	if i == 0 {
		return l.base
	}
	return l.at(i - 1).cum
}

// span counts the events and tokens admitted in (from, to].
func (l *eventLog) span(from, to int64) (requests, tokens int64) {
	i, j := l.firstAfter(from), l.firstAfter(to)
	return int64(j - i), l.cumBefore(j) - l.cumBefore(i)
}

// window returns the index of the oldest event in (now-w, now] and the
// requests and tokens in that window (now is never before the newest event).
func (l *eventLog) window(now, w int64) (first int, requests, tokens int64) {
	i := l.firstAfter(now - w)
	return i, int64(l.n - i), l.total - l.cumBefore(i)
}

// requestWait says whether one more request fits limit in the sliding
// window w ending at now and, if not, how long until it would.
func (l *eventLog) requestWait(now, w, limit int64) (ok bool, wait int64) {
	first, c, _ := l.window(now, w)
	if c+1 <= limit {
		return true, 0
	}
	// c-limit+1 events must leave the window; the last of them is at
	// logical index first+c-limit.
	return false, l.at(first+int(c-limit)).t + w - now
}

// tokenWait says whether need more tokens fit limit in the sliding window w
// ending at now and, if not, how long until they would (need ≤ limit).
func (l *eventLog) tokenWait(now, w, limit, need int64) (ok bool, wait int64) {
	first, _, sum := l.window(now, w)
	excess := sum + need - limit
	if excess <= 0 {
		return true, 0
	}
	// The oldest event j whose departure frees at least excess tokens.
	target := l.cumBefore(first) + excess
	lo, hi := first, l.n-1
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if l.at(mid).cum >= target {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return false, l.at(lo).t + w - now
}
