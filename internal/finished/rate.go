package finished

import "time"

// rateWindow is how far back DrainRate counts, as the back-pressure
// status's drain rate does (internal/api, status.go).
const rateWindow = time.Minute

// rate counts events in one-second buckets over the last rateWindow: a
// ring indexed by the Unix second, each bucket remembering which second
// it holds so that a stale one counts as empty.
type rate struct {
	counts [60]int64
	second [60]int64
}

func (r *rate) add(now time.Time) {
	s := now.Unix()
	i := s % int64(len(r.counts))
	if r.second[i] != s {
		r.second[i], r.counts[i] = s, 0
	}
	r.counts[i]++
}

// sum counts the events of the seconds in (now-rateWindow, now].
func (r *rate) sum(now time.Time) int64 {
	s := now.Unix()
	var n int64
	for i := range r.counts {
		if age := s - r.second[i]; age >= 0 && age < int64(len(r.counts)) {
			n += r.counts[i]
		}
	}
	return n
}
