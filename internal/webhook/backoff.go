package webhook

import "time"

// schedule is the wait after the n-th failed attempt (n from 1); after the
// last entry the wait stays at the last. Short waits first ride out a
// restart or a deploy; long ones a receiver down for hours. Within the
// default retry window of 25h a delivery that never succeeds is tried 13
// times (see nextAttempt).
var schedule = []time.Duration{
	5 * time.Second, 30 * time.Second, 2 * time.Minute, 5 * time.Minute, 15 * time.Minute,
	30 * time.Minute, time.Hour, 2 * time.Hour, 4 * time.Hour, 8 * time.Hour,
}

// jitterSpread is the relative spread of a wait: ±10%, so that deliveries
// failed by the same outage do not all come back at the same instant.
const jitterSpread = 0.1

// Backoff is the wait after the n-th failed attempt (n >= 1), with r in
// [0, 1) drawn for the jitter.
func Backoff(n int, r float64) time.Duration {
	base := schedule[min(max(n, 1), len(schedule))-1]
	return time.Duration(float64(base) * (1 - jitterSpread + 2*jitterSpread*r))
}

// nextAttempt is when to try again after the n-th failed attempt at now, or
// false when the delivery is dead: its retry window ends at deadline. The
// last wait is cut to end at the deadline, so the window is used to its
// end and the final attempt is made at it.
func nextAttempt(n int, now, deadline time.Time, r float64) (time.Time, bool) {
	if !now.Before(deadline) {
		return time.Time{}, false
	}
	next := now.Add(Backoff(n, r))
	if next.After(deadline) {
		next = deadline
	}
	return next, true
}
